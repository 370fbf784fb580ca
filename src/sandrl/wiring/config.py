"""The settings components are built from: the policy (``[model]``), the task set (``[tasks]``), the
episodes (``[rollout]``). ``sandrl train`` reads them from its TOML file
(:mod:`sandrl.train.run_config`); ``sandrl eval`` and the demo override :class:`RolloutConfig`'s
defaults; these defaults are the only ones.

.. code-block:: toml

    [model]                     # ModelConfig
    name = "tiny"
    inference = "embedded"      # or the URL of a server, or vllm://HOST:PORT
    # token_file = "/etc/sandrl-inference.token"   # that server's token (or $SANDRL_INFERENCE_TOKEN)

    [tasks]                     # TasksConfig: a task directory, or a generated family
    family = "echo"             # or path = "verified.jsonl" with swebench_images = "swebench"
                                # or several, each drawn by weight: [[tasks.sources]] path = ..., weight = 3

    [rollout]                   # RolloutConfig: runner, budget, agent and sampling
    concurrency = 8
    max_turns = 4
    max_new_tokens = 128

    [rollout.timeouts]          # sandrl.rollout.episode.EpisodeTimeouts: per-phase backstops
    setup_timeout_s = 600.0

Every field is checked when the object is built: a wrong value is a
:class:`~sandrl.errors.ConfigError` that names the key and what would be valid.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from sandrl.errors import ConfigError
from sandrl.inference.base import UPDATE_POLICIES, UpdatePolicy
from sandrl.inference.transport import HTTPConfig
from sandrl.inference.vllm import SCHEME as VLLM_SCHEME
from sandrl.inference.vllm import server_url
from sandrl.rollout.agents.cli import CLI_AGENTS, CliAgentsConfig
from sandrl.rollout.agents.harness import HARNESSES
from sandrl.rollout.agents.llm import LLMAgentConfig
from sandrl.rollout.episode import EpisodeConfig, EpisodeTimeouts
from sandrl.rollout.runner import RunnerConfig
from sandrl.tasks.builtin.generated import FAMILIES
from sandrl.tasks.swebench_specs import images_setting

EMBEDDED = "embedded"
"""``[model] inference`` for the in-process engine."""

Api = Literal["sglang", "openai", "vllm"]
SANDBOXES = ("local", "e2b")
"""``[rollout] sandboxes``: this machine's bubblewrap sandboxes, or an E2B-compatible service's."""
AGENT_NAMES = ("llm", *HARNESSES, *CLI_AGENTS)
"""The agents ``[rollout] agent`` names, besides a harness's ``module:function``."""


@dataclass(frozen=True)
class ModelConfig:
    """The policy: which model, and where it is sampled."""

    name: str = "tiny"
    """``tiny`` (the built-from-config model) or a local checkpoint directory. With a server, the
    directory of the checkpoint it serves: its tokenizer is read from there."""
    inference: str = EMBEDDED
    """``embedded`` (the in-process engine on ``name``), the URL of a server, or ``vllm://HOST:PORT``
    (a vLLM server: the same as its http:// URL with ``api = "vllm"``). Several servers started
    elsewhere: their URLs joined by commas (``http://a:30000,http://b:30000``), sampled through
    one router that keeps each episode on one of them (:mod:`sandrl.inference.fleet`). To have sandrl
    start the engines, leave this ``embedded`` and set ``[inference] launch``."""
    api: Api = "sglang"
    """The server's routes: ``sglang`` (native ``/generate``: SGLang, ``sandrl serve inference``),
    ``vllm`` (``vllm serve``: OpenAI's completions with token ids, weights reloaded through its
    dev-mode routes, :mod:`sandrl.inference.vllm`) or ``openai`` (any other OpenAI-compatible
    server; weight updates need SGLang's ``/update_weights_from_disk`` too)."""
    update_policy: UpdatePolicy = "in_place"
    """What a weight update does to generations in flight: ``in_place`` (they go on with the new
    weights; each token records its version), ``pause`` (they finish on the old weights first;
    new ones wait) or ``abort_and_resume`` (they stop, and resume from their tokens on the new
    weights). The embedded engine, SGLang servers (sandrl's included) and vLLM servers honour it."""
    token_file: str = ""
    """A file holding the inference server's token, sent as ``Authorization: Bearer <token>`` on every
    request: the token of ``sandrl serve inference --token-file``, or the ``--api-key`` of an SGLang
    or vLLM server. Read where the client runs (each rollout worker's node under ``--ray``); a
    relative path is relative to the config file. Empty: ``$SANDRL_INFERENCE_TOKEN`` if set, else
    no token (a ``sandrl serve inference`` without one serves loopback only and refuses weight
    updates). Not used with ``inference = "embedded"``."""

    def __post_init__(self) -> None:
        if self.update_policy not in UPDATE_POLICIES:
            raise ConfigError(f"update_policy must be one of {', '.join(UPDATE_POLICIES)}, got {self.update_policy!r}")
        if not self.name:
            raise ConfigError("name must be 'tiny' or a checkpoint directory")
        if self.inference.startswith(VLLM_SCHEME):
            if self.api == "openai":
                raise ConfigError(f"inference {self.inference!r} names a vLLM server, but api is 'openai': drop api")
            server_url(self.inference)  # a ConfigError if it is not vllm://HOST:PORT
            object.__setattr__(self, "api", "vllm")
        elif self.inference != EMBEDDED and not (
            self.urls and all(u.startswith(("http://", "https://")) for u in self.urls)
        ):
            raise ConfigError(
                "inference must be 'embedded', an http(s):// URL (or several, joined by commas) or vllm://HOST:PORT, "
                f"got {self.inference!r}"
            )
        if self.api not in ("sglang", "openai", "vllm"):
            raise ConfigError(f"api must be 'sglang', 'openai' or 'vllm', got {self.api!r}")

    @property
    def embedded(self) -> bool:
        return self.inference == EMBEDDED

    @property
    def urls(self) -> tuple[str, ...]:
        """The servers ``inference`` names (one, or several joined by commas); none for ``embedded``."""
        if self.embedded:
            return ()
        return tuple(u.strip() for u in self.inference.split(",") if u.strip())

    def http(self) -> HTTPConfig:
        """The inference clients' HTTP settings: the server's token, read now (see :attr:`token_file`)."""
        from sandrl.inference.auth import load_client_token  # the HTTP stack: only where a client is made

        return HTTPConfig(api_key=load_client_token(self.token_file or None))


SOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")
"""A source's name: a metric key's part (``source/<name>/...``) and, for a family, a directory's."""
_ROW_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class TaskSource:
    """One task set of a run that draws from several (``[[tasks.sources]]``, one table each).

    Each data position draws its source with probability ``weight / sum(weight)`` over the sources
    that have not run out, then that source's next task from a seeded shuffle per pass over its
    tasks (:mod:`sandrl.wiring.task_mix`); all from ``[run] seed``, so a resumed run draws the same
    tasks. Each step's metrics have ``source/<name>/...`` (episodes, reward, pass rate, and the share
    of the run's groups each source has had so far).
    """

    path: str = ""
    """A task directory, a directory of them, a SWE-style row file, or ``builtin`` (as ``[tasks] path``);
    relative to the config file."""
    family: str = ""
    """Or a generated family (:mod:`sandrl.tasks.builtin.generated`), written under the run's ``tasks/<name>/``."""
    count: int = 32
    """Tasks generated of ``family``."""
    seed: int = 0
    """Seed of the generated tasks."""
    weight: float = 1.0
    """How often this source is drawn, relative to the others' weights (``3`` and ``1``: three groups of
    this one for each of the other's); any positive number."""
    epochs: int = 0
    """Passes over this source's tasks before it runs out (``1``: each task once); it is then reported,
    and its weight goes to the sources still drawing, in proportion to theirs. When every source has run
    out the run ends, fewer than ``[run] steps`` steps in. 0: never runs out (each pass a new shuffle)."""
    name: str = ""
    """Names the source in the metrics (``source/<name>/reward_mean``); default: the last part of
    ``path`` (without ``.jsonl``, ``.json`` or ``.parquet``: ``terminal-bench@2.0`` for
    ``datasets/terminal-bench@2.0``), or the family's name. Letters, digits, ``.``, ``_``, ``-``, ``@``
    and ``+``."""

    def __post_init__(self) -> None:
        where = f"source {self.name or self.path or self.family!r}"
        if bool(self.path) == bool(self.family):
            raise ConfigError(
                f"each [[tasks.sources]] takes exactly one of path (a task directory or 'builtin') and family "
                f"(one of {', '.join(FAMILIES)}); got path={self.path!r}, family={self.family!r}"
            )
        if self.family and self.family not in FAMILIES:
            raise ConfigError(f"{where}: family must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        if self.count < 1:
            raise ConfigError(f"{where}: count must be >= 1, got {self.count}")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ConfigError(f"{where}: weight must be a positive number (3 and 1 draw 3:1), got {self.weight!r}")
        if self.epochs < 0:
            raise ConfigError(f"{where}: epochs must be >= 0 (0: the source never runs out), got {self.epochs}")
        if not self.name:
            last = self.family or self.path.rstrip("/").rsplit("/", 1)[-1]
            object.__setattr__(
                self, "name", next((last.removesuffix(s) for s in _ROW_SUFFIXES if last.endswith(s)), last)
            )
        if not SOURCE_NAME.fullmatch(self.name):
            raise ConfigError(
                f'{where}: the name {self.name!r} cannot name a source: give the table name = "..." '
                "(letters, digits and . _ - @ +; at most 64, not starting with one of those)"
            )


@dataclass(frozen=True)
class TasksConfig:
    """What the episodes attempt: a task set on disk, a generated family, or several sources mixed by weight."""

    path: str = ""
    """A task directory, a directory of them, a SWE-bench file, or ``builtin``."""
    family: str = ""
    """A generated family (:mod:`sandrl.tasks.builtin.generated`), written under the run's ``tasks/``."""
    count: int = 32
    """Tasks generated of ``family``."""
    seed: int = 0
    """Seed of the generated tasks."""
    swebench_images: str = ""
    """Where SWE-bench instances run: ``swebench`` (SWE-bench's published images on Docker Hub),
    ``epoch`` (Epoch AI's), ``swegym`` (SWE-Gym's), an image template with ``{instance_id}``,
    ``{instance_key}`` or ``{swegym_key}`` and ``{arch}``; ``local``: from local clones; empty: a
    local clone when there is one, else the published image (:mod:`sandrl.tasks.swebench`).
    SWE-smith's and R2E-Gym's rows run in the image they name (in every source of a mix too)."""
    sources: tuple[TaskSource, ...] = ()
    """Several task sets in one run, instead of ``path`` or ``family``: one ``[[tasks.sources]]`` table
    each, with its ``path`` or ``family`` and its ``weight`` (``weight = 3`` beside ``weight = 1``: three
    groups of the first for each of the second's), each step's metrics split by source."""

    def __post_init__(self) -> None:
        try:
            images_setting(self.swebench_images)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if self.sources:
            self._check_sources()
            return
        if bool(self.path) == bool(self.family):
            raise ConfigError(
                "give exactly one of path (a task directory or 'builtin') and family "
                f"(one of {', '.join(FAMILIES)}), or [[tasks.sources]] tables; got path={self.path!r}, "
                f"family={self.family!r}"
            )
        if self.family and self.family not in FAMILIES:
            raise ConfigError(f"family must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        if self.count < 1:
            raise ConfigError(f"count must be >= 1, got {self.count}")

    def _check_sources(self) -> None:
        if self.path or self.family:
            said = f"path = {self.path!r}" if self.path else f"family = {self.family!r}"
            raise ConfigError(
                f"{said} and [[tasks.sources]] both say what to train on: move {said} into a [[tasks.sources]] "
                "table of its own"
            )
        if (self.count, self.seed) != (TasksConfig.count, TasksConfig.seed):
            raise ConfigError("with [[tasks.sources]], count and seed go in each source table that has a family")
        seen: set[str] = set()
        for source in self.sources:
            if source.name in seen:
                raise ConfigError(
                    f'two [[tasks.sources]] are named {source.name!r}: give each one a name = "..." of its own'
                )
            seen.add(source.name)


@dataclass(frozen=True)
class RolloutConfig:
    """How episodes run: how many at once, grouped and retried; their budget; the LLM agent's settings.

    :func:`sandrl.wiring.build_runner` turns it into a :class:`~sandrl.rollout.runner.RunnerConfig`
    (with its :class:`~sandrl.rollout.episode.EpisodeConfig`) and an
    :class:`~sandrl.rollout.agents.llm.LLMAgentConfig`.
    """

    # -- the runner
    group_size: int = 4
    """Episodes per task (a GRPO group)."""
    concurrency: int = 8
    """Most episodes (and sandboxes) at once."""
    max_attempts: int = 3
    """Attempts per episode on a retryable infra error."""
    host_capacity: int | None = None
    """Commands run at once across the run's sandboxes, the rest queue (capacity-aware admission,
    ``RunnerConfig.host_capacity``); ``false``: every command runs when issued."""
    capacity_file: str = ""
    """Or the host capacity from a ``sandrl bench contention`` result (relative to the config file)."""
    fill_idle_cores: float | None = None
    """With a host capacity: also admit a command while this many cores sit idle (``RunnerConfig.fill_idle_cores``)."""
    fork_groups: bool = False
    """Set each group's task up once, in one sandbox, and start its episodes from a snapshot of it
    (:mod:`sandrl.rollout.forks`): for tasks whose setup is expensive. Needs a provider that forks."""

    # -- where the sandboxes are
    sandboxes: str = "local"
    """``local`` (bubblewrap on this machine) or ``e2b`` (an E2B-compatible service through the ``e2b``
    SDK, configured by its own ``E2B_API_KEY``, ``E2B_DOMAIN`` or ``E2B_API_URL``/``E2B_SANDBOX_URL``:
    E2B, or a sandrl host's ``sandrl serve sandboxes``; see :mod:`sandrl.sandbox.e2b.provider`)."""
    create_concurrency: int = 8
    """With ``e2b``: sandbox creates in flight at once (the rest wait); refused creates are retried with backoff."""

    # -- the budget of one episode
    max_turns: int = 4
    """Model replies per episode; the episode ends ``truncated`` after the last one if the agent has not
    finished (the verifier still scores what the sandbox holds)."""
    max_total_tokens: int = 2048
    """Prompt, model output and observations together; capped at the policy's context length."""
    wall_time_s: float | None = None
    """The agent's wall-time budget; ``false``: each task's own agent timeout."""
    timeouts: EpisodeTimeouts = field(default_factory=EpisodeTimeouts)
    """``[rollout.timeouts]``: how long each phase of an episode may take."""

    # -- the LLM agent and its sampling
    max_new_tokens: int = 128
    """Per model turn."""
    temperature: float = 1.0
    """0: greedy (evaluation only; a training run samples)."""
    system_prompt: str = ""
    """The LLM agent's system prompt; empty: its format's own (:mod:`sandrl.rollout.agents.formats`). A small
    model with a short context trains faster on a short one; it must be the one it was warm-started on."""
    agent: str = "llm"
    """Who acts: ``llm`` (sandrl's agent, in ``format``), ``mini-swe-agent`` or ``terminus-2`` (harnesses,
    through the session gateway), ``claude-code`` or ``codex`` (CLI agents, run inside the sandbox at the
    versions ``[rollout.cli_agents]`` pins; see :mod:`sandrl.rollout.agents.cli`), or ``module:function``
    (any Python harness; see :mod:`sandrl.rollout.agents.harness`)."""
    cli_agents: CliAgentsConfig = field(default_factory=CliAgentsConfig)
    """``[rollout.cli_agents]``: the CLI agents' pinned versions and where they come from."""
    format: str = "fenced"
    """The ``llm`` agent's action format: ``fenced`` (one ```bash block per reply) or ``tools`` (tool calls)."""
    tool_parser: str = ""
    """The tool-call parser (``hermes``, ``glm45``, ``llama3_json``); empty: detected from the chat template."""
    tools: str = ""
    """The sandbox tools offered in ``tools`` format, comma-separated (``"bash,submit"``); empty: all
    (bash, write_file, edit_file, submit)."""

    def tool_names(self) -> tuple[str, ...] | None:
        """``tools`` as names; None for all."""
        names = tuple(n.strip() for n in self.tools.split(",") if n.strip())
        return names or None

    observation_tokens: int = LLMAgentConfig.observation_tokens
    """Most tokens of a command's output shown to the model (head and tail kept)."""
    command_timeout_s: float = LLMAgentConfig.command_timeout_s
    """Per command, unless the task sets its own."""

    def runner(
        self, *, host_capacity: int | None, run_id: str | None = None, episode: EpisodeConfig | None = None
    ) -> RunnerConfig:
        """The runner's settings of this ``[rollout]``, with ``host_capacity`` (:meth:`slots`, once its file is
        read), ``run_id`` and the episodes' ``episode`` config; :class:`RunnerConfig` checks them."""
        return RunnerConfig(
            concurrency=self.concurrency,
            group_size=self.group_size,
            max_attempts=self.max_attempts,
            host_capacity=host_capacity,
            fill_idle_cores=self.fill_idle_cores,
            run_id=run_id,
            fork_groups=self.fork_groups,
            episode=episode if episode is not None else EpisodeConfig(),
        )

    def slots(self) -> int | None:
        """The host capacity to admit commands up to, reading ``capacity_file`` if that is how it is given."""
        if self.capacity_file:
            from sandrl.capacity import slots_from_file

            return slots_from_file(self.capacity_file)
        return self.host_capacity

    def __post_init__(self) -> None:
        if self.host_capacity is not None and self.capacity_file:
            raise ConfigError("give host_capacity or capacity_file, not both")
        self.runner(host_capacity=self.host_capacity)  # the runner's settings, checked where they are held
        if self.sandboxes not in SANDBOXES:
            raise ConfigError(f"sandboxes must be one of {', '.join(SANDBOXES)}, got {self.sandboxes!r}")
        for name in ("max_turns", "max_total_tokens", "max_new_tokens", "create_concurrency"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.wall_time_s is not None and not (math.isfinite(self.wall_time_s) and self.wall_time_s > 0):
            raise ConfigError(f"wall_time_s must be a positive number of seconds, got {self.wall_time_s!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if self.format not in ("fenced", "tools"):
            raise ConfigError(f"format must be 'fenced' or 'tools', got {self.format!r}")
        if ":" not in self.agent and self.agent not in AGENT_NAMES:
            raise ConfigError(
                f"agent must be one of {', '.join(AGENT_NAMES)} or a harness's 'module:function', got {self.agent!r}"
            )
        if self.max_new_tokens > self.max_total_tokens:
            raise ConfigError(
                f"max_new_tokens ({self.max_new_tokens}) is more than max_total_tokens ({self.max_total_tokens}); "
                "one turn could never fit"
            )
