"""SWE-smith instances (``SWE-bench/SWE-smith`` on Hugging Face): bugs put into a repository on purpose.

A row (``swesmith.harness.gather``): ``instance_id`` (``owner__repo.<commit8>.<bug kind>__<hash>``),
``repo`` (``swesmith/owner__repo.<commit8>``: SWE-smith's mirror of the repository at one commit),
``patch`` (the diff that *puts the bug in*: the fix is its reverse), ``FAIL_TO_PASS`` and
``PASS_TO_PASS`` (pytest ids), ``image_name`` (one image per repository, the mirror at
``/testbed`` and its conda environment ``testbed``), ``problem_statement``, and often
``base_commit``: the bug's commit, on the mirror's branch named after the instance.

How it runs, after SWE-smith's harness (``harness/utils.py`` ``run_patch_in_container``,
``profiles/``):

- **the repository** is the bug's commit: ``base_commit`` when the image has it, else the branch
  named after the instance, else (an image made before the branch, and no network to fetch it) the
  image's ``HEAD`` with ``patch`` applied and committed, as SWE-smith made the branch. The commit
  is resolved when the sandbox is set up, before the agent, and kept here on the host for grading
  (:func:`graded_base`): nothing the agent does in the sandbox moves it;
- **the tests** are the repository profile's command (``pytest --disable-warnings --color=no
  --tb=no --verbose`` unless the profile says otherwise; mypy's picks test cases with ``-k``) on
  the files of ``FAIL_TO_PASS``, in the conda environment ``testbed``;
- **grading** is SWE-bench's (:mod:`sandrl.tasks.swebench_eval`): the agent's diff applied to the
  bug's commit, the test files reset to it, pytest's JUnit report. As SWE-smith's harness, only the
  ``PASS_TO_PASS`` tests of the files that run are graded; unlike it, a graded test that did not
  run is a failure (the harness counts it as passed, so a change that breaks collection would pass);
- **the oracle** applies ``patch`` in reverse.

Profiles whose tests are not run by pytest (python-slugify's, tornado's) and non-Python instances
(their ids are not pytest's) are reported and skipped: their logs need parsers of their own.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from sandrl.errors import InvalidTaskError, TaskError
from sandrl.sandbox.base import Sandbox
from sandrl.tasks.rows import (
    DEFAULT_TIMEOUT_S,
    REPO_DIR,
    image_field,
    instruction_field,
    optional_string,
    patch_files,
    published_environment,
    require,
    sha_field,
    string_field,
    test_list,
)
from sandrl.tasks.sandbox_io import empty_dir_command, run
from sandrl.tasks.swebench_specs import CONDA_ACTIVATE
from sandrl.tasks.task import SolutionSpec, SweBenchInstance, Task, VerifierSpec

PROFILE_TEST_COMMAND = "pytest --disable-warnings --color=no --tb=no --verbose"
"""``PythonProfile.test_cmd``: every Python profile's but those in :data:`TEST_COMMANDS`."""
TEST_COMMANDS: dict[str, str] = {
    "tkrajina__gpxpy": "pytest test.py --verbose --color=no --tb=no --disable-warnings",
    "jax-ml__jax": "pytest --disable-warnings --color=no --tb=no --verbose -n auto",
    "mido__mido": "pytest --disable-warnings --color=no --tb=no --verbose -rs -c /dev/null",
    "paramiko__paramiko": "pytest -rA --color=no --disable-warnings",
    "pydantic__pydantic": "/root/.local/bin/uv run pytest --disable-warnings --color=no --tb=no --verbose",
    "python__mypy": "pytest --color=no -rA",
}
"""The profiles' own ``test_cmd`` (``profiles/python.py``), by ``owner__repo`` lower-cased."""
NOT_PYTEST: dict[str, str] = {
    "un33k__python-slugify": "python test.py --verbose",
    "tornadoweb__tornado": "python -m tornado.test --verbose",
}
"""Profiles whose tests another runner runs: their instances are skipped."""
_MYPY = "python__mypy"

_REQUIRED = ("instance_id", "repo", "patch", "FAIL_TO_PASS", "PASS_TO_PASS", "image_name")
_MIRROR = re.compile(r"^[A-Za-z0-9_.-]+/(?P<profile>[A-Za-z0-9_.-]+?__[A-Za-z0-9_.-]+?)\.[0-9a-f]{8}$")
_INSTANCE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
_SETUP_DIR = "/tmp/sandrl-swesmith"
_BUG_IDENTITY = {
    # The commit made from the bug patch is the same for every episode of one image.
    "GIT_AUTHOR_NAME": "swesmith",
    "GIT_AUTHOR_EMAIL": "swesmith@swesmith.ai",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "swesmith",
    "GIT_COMMITTER_EMAIL": "swesmith@swesmith.ai",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
_SHA40 = re.compile(r"^[0-9a-f]{40}$")
SETUP_TIMEOUT_S = 300.0

_bases: dict[str, str] = {}
"""Task key → the bug's commit its sandboxes were set up at, in this process (see the module)."""


def _test_files(fail_to_pass: tuple[str, ...], where: str, path: Path) -> tuple[str, ...]:
    files: dict[str, None] = {}
    for test in fail_to_pass:
        file, sep, _ = test.partition("::")
        if not sep or not file.endswith(".py"):
            raise InvalidTaskError(
                f"{where}: FAIL_TO_PASS holds {test[:120]!r}, not a pytest id (file.py::test); only SWE-smith's "
                "pytest-run instances are supported",
                path=path,
            )
        files[file] = None
    return tuple(sorted(files))


def to_task(record: Mapping[str, object], where: str, path: Path, test_command: str | None) -> Task:
    """The task of one SWE-smith row (``where`` names it in errors); raises InvalidTaskError for a bad row."""
    require(record, _REQUIRED, where, path, "a SWE-smith instance")
    instance_id = string_field(record, "instance_id", where, path)
    if not _INSTANCE_ID.match(instance_id):
        raise InvalidTaskError(
            f"{where}: instance_id must be letters, digits, '_', '.' and '-' (owner__repo.commit.bug), "
            f"got {instance_id[:120]!r}",
            path=path,
        )
    repo = string_field(record, "repo", where, path)
    mirror = _MIRROR.match(repo)
    if mirror is None:
        raise InvalidTaskError(
            f"{where}: repo must be SWE-smith's mirror 'org/owner__repo.<8 hex>' (swesmith/pallets__flask.bc098406), "
            f"got {repo[:120]!r}",
            path=path,
        )
    profile = mirror.group("profile").lower()
    bug = string_field(record, "patch", where, path)
    if not patch_files(bug):
        raise InvalidTaskError(f"{where}: patch is not a git diff; it is the change that makes the bug", path=path)
    base = optional_string(record, "base_commit", where, path)
    if base is not None:
        sha_field(base, "base_commit", where, path)
    fail_to_pass = test_list(record, "FAIL_TO_PASS", where, path)
    pass_to_pass = test_list(record, "PASS_TO_PASS", where, path)
    if not fail_to_pass:
        raise InvalidTaskError(f"{where}: FAIL_TO_PASS is empty, so nothing shows the bug is fixed", path=path)
    if profile in NOT_PYTEST:
        raise InvalidTaskError(
            f"{where}: {repo}'s tests run with {NOT_PYTEST[profile]!r}, not pytest; only pytest-run instances "
            "are supported",
            path=path,
        )
    image = image_field(record, "image_name", where, path)
    instruction = instruction_field(record, where, path)
    test_files = _test_files(fail_to_pass, where, path)

    base_command = test_command or TEST_COMMANDS.get(profile, PROFILE_TEST_COMMAND)
    if profile == _MYPY:
        # mypy's tests are cases in data files, picked by name (the harness's get_test_command_mypy).
        cases = tuple(test.rsplit("::", 1)[-1] for test in fail_to_pass)
        command = f"{base_command} -k {shlex.quote(' or '.join(cases))}"
        graded = tuple(test for test in pass_to_pass if test.rsplit("::", 1)[-1] in cases)
    else:
        command = " ".join([base_command, *(shlex.quote(file) for file in test_files)])
        graded = tuple(test for test in pass_to_pass if test.partition("::")[0] in test_files)
    instance = SweBenchInstance(
        instance_id=instance_id,
        repo=repo,
        base_commit=base or "",
        patch="",
        test_patch="",
        fail_to_pass=fail_to_pass,
        pass_to_pass=graded,
        repo_source=None,
        test_command=command,
        test_files=test_files,
        repo_dir=REPO_DIR,
        test_prelude=CONDA_ACTIVATE,
        parser="junit",
        bug_patch=bug,
    )
    metadata = {key: value for key, value in record.items() if key not in (*_REQUIRED, "problem_statement")}
    metadata["PASS_TO_PASS_not_graded"] = len(pass_to_pass) - len(graded)
    return Task(
        id=instance_id,
        name=instance_id,
        source=path,
        format="swe-smith",
        instruction=instruction,
        environment=published_environment(image),
        verifier=VerifierSpec(command=command, timeout_s=DEFAULT_TIMEOUT_S, reward="swe-bench"),
        # The fix is the bug's patch undone (the harness's gold prediction, applied with --reverse).
        solution=SolutionSpec(command="git apply --verbose --reverse -", stdin=bug),
        agent_timeout_s=DEFAULT_TIMEOUT_S,
        metadata=MappingProxyType(metadata),
        swebench=instance,
    )


# --- the repository in the sandbox ------------------------------------------------------------


def _setup_script(instance: SweBenchInstance) -> str:
    assert instance.bug_patch is not None
    base = shlex.quote(f"{instance.base_commit}^{{commit}}") if instance.base_commit else "''"
    branches = ("heads", "remotes/origin")
    heads = " ".join(shlex.quote(f"refs/{kind}/{instance.instance_id}^{{commit}}") for kind in branches)
    bug = shlex.quote(f"{_SETUP_DIR}/bug.patch")
    files = " ".join(shlex.quote(name) for name in patch_files(instance.bug_patch))
    message = shlex.quote(f"Bug Patch: {instance.instance_id}")
    return f"""set -e
base={base}
if [ "$base" != '' ] && git cat-file -e "$base" 2>/dev/null; then
    git checkout -q -f "$base"
    git rev-parse HEAD
    exit 0
fi
for ref in {heads}; do
    if sha=$(git rev-parse -q --verify "$ref"); then
        git checkout -q -f "$sha"
        git rev-parse HEAD
        exit 0
    fi
done
git reset -q --hard HEAD
git apply {bug} || patch --batch --fuzz=5 -p1 -i {bug}
git add -A -- {files}
git -c commit.gpgsign=false commit -q --no-verify -m {message}
git rev-parse HEAD
"""


async def setup_bug(task: Task, instance: SweBenchInstance, sandbox: Sandbox) -> None:
    """Put the repository at the bug's commit (see the module) and remember that commit for grading."""
    assert instance.bug_patch is not None
    await run(sandbox, empty_dir_command(_SETUP_DIR), what="making the setup directory")
    await sandbox.write_file(f"{_SETUP_DIR}/bug.patch", instance.bug_patch.encode())
    done = await sandbox.exec(
        f"bash -c {shlex.quote(_setup_script(instance))}",
        cwd=instance.repo_dir,
        env=_BUG_IDENTITY,
        timeout_s=SETUP_TIMEOUT_S,
    )
    sha = done.stdout.strip().rsplit("\n", 1)[-1] if done.exit_code == 0 else ""
    if not _SHA40.match(sha):
        said = " ".join((done.stderr or done.stdout).split())[-400:]
        raise TaskError(
            f"task {task.id}: the image {task.environment.docker_image} has no repository at {instance.repo_dir} "
            f"that the bug can be put into ({said}); is it SWE-smith's image of {instance.repo}?"
        )
    known = _bases.setdefault(task.key, sha)
    if known != sha:
        raise TaskError(
            f"task {task.id}: its repository was set up at {sha}, but an earlier sandbox of it at {known}; "
            "the image changed while the tasks were loaded: load them again"
        )


def graded_base(task: Task) -> str | None:
    """The bug's commit ``task``'s sandboxes were set up at in this process; None before any was."""
    return _bases.get(task.key)
