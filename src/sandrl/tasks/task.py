"""The task model: what an episode attempts, independent of the format it was written in.

A :class:`Task` is loaded from a Harbor task directory, a Terminal-Bench 1 task directory or an
instance row of SWE-bench, SWE-Gym, SWE-smith or R2E-Gym (see :mod:`sandrl.tasks.loader`). It says
what the agent is told (``instruction``), where it works (:class:`EnvironmentSpec`), how its work
is judged (:class:`VerifierSpec`) and, when the format has one, a reference solution
(:class:`SolutionSpec`). Every field is plain data; nothing here touches a sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from sandrl.sandbox.base import ImageSource, SandboxSpec
from sandrl.tasks.envvars import resolve_env

TaskFormat = Literal["harbor", "terminal-bench", "swe-bench", "swe-smith", "r2e-gym"]
"""The on-disk format a task was loaded from (SWE-Gym's rows are SWE-bench's)."""

RewardSource = Literal["reward-file", "pytest-summary", "swebench-log", "swe-bench", "r2e-gym"]
"""How the verifier's reward is read.

- ``reward-file``: Harbor; the test command writes ``/logs/verifier/reward.txt`` (one number)
  or ``/logs/verifier/reward.json`` (an object of named numbers; which one is the reward:
  :func:`sandrl.tasks.verify.reward_of`).
- ``pytest-summary``: Terminal-Bench 1; the pytest "short test summary info" lines of the test
  command's output, every test passed = reward 1.
- ``swebench-log``: Terminal-Bench 1's ``parser_name: swebench``; the test command prints the
  SWE-bench harness's verdict between ``SWEBench results starts here`` and ``SWEBench results ends
  here``, and the task passed when that block is exactly ``PASSED``.
- ``swe-bench``: the SWE-bench harness; the model's diff and the test patch are applied, the tests
  run with a JUnit XML report, resolved when every FAIL_TO_PASS and PASS_TO_PASS test passed.
- ``r2e-gym``: R2E-Gym's; the image's hidden tests run, and every test's status must be the one the
  instance expects (:mod:`sandrl.tasks.r2e_gym_eval`).
"""

TestParser = Literal["junit", "django", "sympy"]
"""How a SWE-bench test run is read: pytest's JUnit XML report, or Django's or SymPy's runner's log."""

TESTS_DIR = "/tests"
"""Where a task's tests are written at verify time (Harbor's and Terminal-Bench's path)."""
VERIFIER_LOGS_DIR = "/logs/verifier"
"""Where a Harbor test script writes its reward file."""


def _frozen(mapping: Mapping[str, object] | None = None) -> Mapping[str, object]:
    return MappingProxyType(dict(mapping or {}))


def _frozen_str(mapping: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


def _frozen_paths(mapping: Mapping[str, Path] | None = None) -> Mapping[str, Path]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class EnvironmentSpec:
    """The machine the agent works in, as the task asks for it."""

    dockerfile: Path | None = None
    """The task's Dockerfile on the host, if it has one."""
    dockerfile_text: str | None = None
    """Its text, read when the task was loaded."""
    context_dir: Path | None = None
    """The Docker build context (Harbor: ``environment/``; Terminal-Bench: the task directory)."""
    compose_file: Path | None = None
    """A ``docker-compose.yaml`` the task ships; recorded, not run (multi-container tasks need Docker)."""
    docker_image: str | None = None
    """A prebuilt image the task names instead of (or besides) a Dockerfile."""
    base_image: str | None = None
    """The image the Dockerfile's final stage starts ``FROM``."""
    cpus: float = SandboxSpec.cpus
    memory_mb: int = SandboxSpec.memory_mb
    storage_mb: int = 10240
    """Harbor's default disk for a task (a sandbox's own default is smaller)."""
    allow_internet: bool = True
    env: Mapping[str, str] = field(default_factory=_frozen_str)
    """Environment of every command; values may be ``${VAR}`` templates read from the host at run time."""
    workdir: str = "/app"
    build_timeout_s: float = 600.0


@dataclass(frozen=True)
class VerifierSpec:
    """How the agent's work is judged once it has finished."""

    command: str
    """The shell command run in the sandbox (in the environment's workdir)."""
    timeout_s: float
    reward: RewardSource
    tests_dir: Path | None = None
    """The task's ``tests/`` on the host; written to :data:`TESTS_DIR` only at verify time."""
    uploads: Mapping[str, Path] = field(default_factory=_frozen_paths)
    """Sandbox path → host file or directory, written in order before the command runs."""
    env: Mapping[str, str] = field(default_factory=_frozen_str)
    """Extra environment of the test command; values may be ``${VAR}`` templates."""
    reward_key: str | None = None
    """``reward-file``: the key of a several-key ``reward.json`` that is the reward (``[verifier]
    reward_key``); None: the key ``reward``, a single key, or else the mean of them all."""


@dataclass(frozen=True)
class SolutionSpec:
    """A reference ("oracle") solution: a command that solves the task when run in the environment."""

    command: str
    uploads: Mapping[str, Path] = field(default_factory=_frozen_paths)
    """Sandbox path → host file or directory, written before the command runs."""
    stdin: str | None = None
    """Fed to the command (SWE-bench: the gold patch for ``git apply``)."""
    env: Mapping[str, str] = field(default_factory=_frozen_str)
    script: Path | None = None
    """The solution script on the host, when there is one file to show."""


@dataclass(frozen=True)
class SweBenchInstance:
    """The SWE-bench fields grading needs (the rest stays in :attr:`Task.metadata`)."""

    instance_id: str
    repo: str
    """``owner/name`` on GitHub."""
    base_commit: str
    patch: str
    """The gold patch (the oracle solution); empty for SWE-smith, whose fix is ``bug_patch`` reversed."""
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    repo_source: Path | None
    """A local clone or mirror of ``repo``, checked out into the sandbox at ``base_commit``; None when
    the task's image (:attr:`EnvironmentSpec.docker_image`, SWE-bench's published one) has it at
    ``repo_dir`` already. Nothing is fetched from the internet."""
    test_command: str
    """Runs the tests touched by ``test_patch``; with the ``junit`` parser a JUnit XML path is appended
    (or put at ``{junit_xml}``)."""
    test_files: tuple[str, ...]
    """Files ``test_patch`` touches; reset to ``base_commit`` before it is applied."""
    environment_setup_commit: str | None = None
    version: str | None = None
    repo_dir: str = "/testbed"
    """Where the repository is checked out in the sandbox (SWE-bench's path)."""
    test_prelude: str = ""
    """Shell lines run before ``test_command`` in the same bash (the image's conda environment and the
    harness's ``eval_commands``); empty in a local clone."""
    parser: TestParser = "junit"
    """How the test run's per-test results are read (:mod:`sandrl.tasks.swebench_logs`)."""
    bug_patch: str | None = None
    """SWE-smith: the diff that put the bug into the image's repository. The repository graded
    against is ``base_commit`` (or the branch named after the instance) when the image has it, else
    the image's HEAD with this applied (:mod:`sandrl.tasks.swe_smith`); None for SWE-bench."""


@dataclass(frozen=True)
class R2eGymInstance:
    """The R2E-Gym fields grading needs (:mod:`sandrl.tasks.r2e_gym`)."""

    repo_name: str
    """R2E-Gym's short name of the repository (``pandas``, ``aiohttp``...)."""
    commit_hash: str
    """The commit that fixed it; the image's repository is at its parent, ``old_commit``."""
    old_commit: str
    expected: Mapping[str, str]
    """Test name (R2E-Gym's: ``TestClass.test_name``) → ``PASSED``, ``FAILED`` or ``ERROR`` after the fix."""
    repo_dir: str = "/testbed"
    tests_dir: str = "/r2e_tests"
    """Where the image keeps the tests; they are taken out of the sandbox before the agent starts."""
    run_tests: str = "/testbed/run_tests.sh"
    """The image's script that runs them (``pytest -rA r2e_tests`` in ``repo_dir``)."""


StepReward = Literal["mean", "final"]
"""How a multi-step task's reward comes from its steps' (Harbor's ``multi_step_reward_strategy``)."""


@dataclass(frozen=True)
class Healthcheck:
    """A command that must succeed before an agent starts (Harbor's, as Docker's ``HEALTHCHECK``): run
    until it exits 0; failures in the first ``start_period_s`` do not count, and ``retries`` failures
    in a row after it fail the check."""

    command: str
    interval_s: float = 5.0
    timeout_s: float = 30.0
    """One run's limit."""
    start_period_s: float = 0.0
    start_interval_s: float = 5.0
    retries: int = 3


@dataclass(frozen=True)
class TaskStep:
    """One step of a Harbor multi-step task (``[[steps]]`` and ``steps/<name>/``)."""

    name: str
    instruction: str
    verifier: VerifierSpec
    """The step's tests: the task's ``tests/`` with the step's own ``tests/`` over it."""
    agent_timeout_s: float
    solution: SolutionSpec | None = None
    """The step's part of the oracle: its ``solution/solve.sh``, else the task's ``solution/solve.sh``."""
    workdir_files: Path | None = None
    """``steps/<name>/workdir/``: copied into the working directory just before the step's agent; its
    ``setup.sh`` is run there."""
    min_reward: Mapping[str, float] | None = None
    """Later steps are not run when a reward of this step is below its threshold (or missing)."""
    healthcheck: Healthcheck | None = None
    """Run after the step's setup, before its agent (``[steps.healthcheck]``)."""
    artifacts: tuple[str, ...] = ()
    """Sandbox paths recorded after the step's agent, before its verifier: the task's ``artifacts``
    then the step's, then Harbor's ``/logs/artifacts``."""


@dataclass(frozen=True)
class Task:
    """One task, whatever format it came from."""

    id: str
    """Unique within a task set: the directory name, or the SWE-bench ``instance_id``."""
    name: str
    """For people: Harbor's ``[task] name`` when set, else the id."""
    source: Path
    """The task directory, or the instance file."""
    format: TaskFormat
    instruction: str
    environment: EnvironmentSpec
    verifier: VerifierSpec
    solution: SolutionSpec | None = None
    agent_timeout_s: float = 600.0
    metadata: Mapping[str, object] = field(default_factory=_frozen)
    """Author, difficulty, tags and other descriptive fields, as the format names them."""
    extra: Mapping[str, object] = field(default_factory=_frozen)
    """Keys sandrl does not know, kept as read (dotted paths, e.g. ``environment.gpus_per_node``)."""
    swebench: SweBenchInstance | None = None
    r2e_gym: R2eGymInstance | None = None
    steps: tuple[TaskStep, ...] = ()
    """A Harbor multi-step task's steps, in order; empty for every other task. An episode runs them
    as Harbor does, each step's setup, agent and verifier before the next step's
    (:mod:`sandrl.tasks.multi_step`, :mod:`sandrl.rollout.multi_step`)."""
    step_reward: StepReward = "mean"

    @property
    def key(self) -> str:
        """The task's id with where it came from: unique across task sets (ids alone may repeat)."""
        return f"{self.source}:{self.id}"

    def image_source(self) -> ImageSource:
        """Where this task's image comes from, for a provider's
        :meth:`~sandrl.sandbox.base.SandboxProvider.resolve_image`: its Dockerfile, built in its
        build context (the Dockerfile's directory, or the task's own) within its
        ``build_timeout_sec``, with the network as Docker builds have it (``allow_internet`` is
        about the agent's sandbox, not the build); or the prebuilt image it names."""
        env = self.environment
        context = env.context_dir or (env.dockerfile.parent if env.dockerfile is not None else self.source)
        return ImageSource(
            label=f"task {self.id}",
            name=self.id,
            dockerfile_text=env.dockerfile_text,
            dockerfile=env.dockerfile,
            context_dir=context,
            image=env.docker_image,
            build_timeout_s=env.build_timeout_s,
            cpus=env.cpus,
            memory_mb=env.memory_mb,
            disk_mb=env.storage_mb,
        )

    def to_sandbox_spec(self, *, image: str = "host") -> SandboxSpec:
        """The sandbox this task runs in.

        ``image`` is the image of :meth:`image_source` on the provider (its ``resolve_image``
        builds it, or finds it in the cache, and returns its name); ``host`` when the task has
        none. A template in the task's environment (``${VAR}``) is resolved from the host's
        environment here.
        """
        env = self.environment
        # The TTL is a backstop against leaks, so it covers every phase with room to spare.
        ttl_s = self.environment.build_timeout_s + self.agent_timeout_s + self.verifier.timeout_s + 600.0
        return SandboxSpec(
            image=image,
            cpus=env.cpus,
            memory_mb=env.memory_mb,
            disk_mb=env.storage_mb,
            network=env.allow_internet,
            ttl_s=ttl_s,
            workdir=env.workdir,
            env=resolve_env(env.env, where=f"task {self.id}: environment env"),
        )
