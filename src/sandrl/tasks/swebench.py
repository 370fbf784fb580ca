"""SWE-bench instances, read from the JSON, JSONL or Parquet files the dataset is published as;
and the loading of every file of SWE-style rows, which holds SWE-smith's and R2E-Gym's too.

A file's rows are read by :mod:`sandrl.tasks.rows`, which tells each row's dataset: SWE-bench's and
SWE-Gym's rows load here, SWE-smith's in :mod:`sandrl.tasks.swe_smith`, R2E-Gym's in
:mod:`sandrl.tasks.r2e_gym`. A row that is malformed is reported with its id and why, and the
others load.

An instance names a GitHub repository and a commit, and is graded in one of two environments:

- **its published image** (:mod:`sandrl.tasks.swebench_specs`): SWE-bench's per-instance image
  (``swebench/sweb.eval.x86_64.<id>:latest``, Epoch AI's ``ghcr.io/epoch-research/...``, or a
  template of your own) as :attr:`EnvironmentSpec.docker_image`; the repository is at ``/testbed``
  with its dependencies installed in the conda environment ``testbed``, and the tests run as the
  harness runs them. This is how real instances run: their tests import the repository's
  dependencies.
- **a local clone** (``swebench_images = "local"``): the repository from this machine, checked
  out at ``base_commit`` into the sandbox; its tests run in whatever Python the sandbox's image
  has. A local clone is a directory in the mirror holding ``<owner>__<name>`` (SWE-bench's own
  spelling), ``<owner>/<name>`` or ``<name>``, bare (``.git``) or not; by default the mirror is
  the ``repos/`` directory next to the instance file.

``swebench_images`` picks one: ``"swebench"`` (Docker Hub, the harness's default namespace),
``"epoch"``, ``"swegym"`` (SWE-Gym's, :mod:`sandrl.tasks.swe_gym`) or a template
(``{instance_id}``, ``{instance_key}``, ``{swegym_key}``, ``{arch}``) for the images; ``"local"``
for clones only. Unset (``"auto"``): the clone when the mirror has one, else the instance's
published image: SWE-Gym's for SWE-Gym's repositories, else the ``swebench`` namespace's.
SWE-smith's and R2E-Gym's rows name their image themselves and always run in it.

``FAIL_TO_PASS`` and ``PASS_TO_PASS`` are JSON-encoded strings in the published dataset and real
lists in many exports; both are read. The test command is the instance's own ``test_cmd``, else
the caller's, else the harness's for the repository and version (images) or ``pytest -rA``
(clones), on the test files ``test_patch`` touches.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from sandrl.errors import InvalidTaskError
from sandrl.tasks import r2e_gym, swe_smith
from sandrl.tasks.rows import (
    DEFAULT_TIMEOUT_S,
    REPO_DIR,
    instruction_field,
    iter_records,
    optional_string,
    patch_files,
    published_environment,
    require,
    row_format,
    row_label,
    sha_field,
    string_field,
    test_list,
)
from sandrl.tasks.swebench_specs import (
    AUTO,
    eval_prelude,
    harness_test_command,
    images_setting,
    instance_image,
    parser_for,
    published_images,
    test_directives,
)
from sandrl.tasks.task import SolutionSpec, SweBenchInstance, Task, VerifierSpec
from sandrl.toml_config import type_name

DEFAULT_TEST_COMMAND = "pytest -rA"

_REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")
_OPTIONAL = ("environment_setup_commit", "version", "problem_statement", "test_cmd")
_REPO_NAME = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


def _is_git_repo(path: Path) -> bool:
    return (path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())


def find_repo(repo: str, repos: Path) -> Path | None:
    """A local copy of ``owner/name``: ``repos`` itself if it is that clone, else a mirror entry."""
    owner, name = repo.split("/", 1)
    candidates = [repos / f"{owner}__{name}", repos / owner / name, repos / name]
    candidates += [c.with_name(c.name + ".git") for c in list(candidates)]
    for candidate in candidates:
        if candidate.is_dir() and _is_git_repo(candidate):
            return candidate
    if _is_git_repo(repos):
        return repos  # a single clone given directly
    return None


def _check_commit(source: Path, commit: str, where: str, path: Path) -> None:
    done = subprocess.run(
        ["git", "-C", str(source), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise InvalidTaskError(
            f"{where}: commit {commit} is not in {source}; update the clone (git -C {source} fetch --all) "
            "on a machine with internet access",
            path=path,
        )


@dataclass(frozen=True)
class _Loading:
    """How one file's rows become tasks: :func:`load_swebench_instances`'s settings, resolved."""

    path: Path
    repos: Path
    test_command: str | None
    verify_commits: bool
    images: str | None


def _to_task(record: Mapping[str, object], where: str, how: _Loading) -> Task:
    path, repos, test_command, images = how.path, how.repos, how.test_command, how.images
    require(record, _REQUIRED, where, path, "a SWE-bench instance")
    strings: dict[str, str] = {key: string_field(record, key, where, path) for key in _REQUIRED[:5]}
    for key in _OPTIONAL:
        value = optional_string(record, key, where, path)
        if value is not None:
            strings[key] = value
    instance_id, repo = strings["instance_id"], strings["repo"]
    if not _REPO_NAME.match(repo):
        raise InvalidTaskError(f"{where}: repo must be 'owner/name', got {repo!r}", path=path)
    base_commit = sha_field(strings["base_commit"], "base_commit", where, path)
    if not strings["test_patch"].strip():
        raise InvalidTaskError(f"{where}: test_patch is empty; it adds the tests that grade the instance", path=path)
    fail_to_pass = test_list(record, "FAIL_TO_PASS", where, path)
    pass_to_pass = test_list(record, "PASS_TO_PASS", where, path)
    if not fail_to_pass:
        raise InvalidTaskError(f"{where}: FAIL_TO_PASS is empty, so nothing shows the issue is fixed", path=path)

    test_patch = strings["test_patch"]
    test_files = patch_files(test_patch)
    version = strings.get("version")
    own_command = strings.get("test_cmd") or test_command
    source: Path | None = None
    image: str | None = None
    if images == AUTO:
        # A clone here means the user set one up for this; otherwise the instance's own image.
        images = None if find_repo(repo, repos) is not None else published_images(repo)
    if images is not None:
        # The published image: the repository and its environment are in it.
        image = instance_image(instance_id, images)
        if own_command:
            command = " ".join([own_command, *test_directives(repo, test_files, test_patch)])
        else:
            command = harness_test_command(repo, version, test_files, test_patch)
    else:
        source = find_repo(repo, repos)
        if source is None:
            owner, name = repo.split("/", 1)
            raise InvalidTaskError(
                f"{where}: no local copy of {repo} in {repos} (looked for {owner}__{name}, {owner}/{name}, {name}); "
                f"sandrl fetches nothing, so clone it first: git clone https://github.com/{repo} "
                f"{repos}/{owner}__{name}, or grade it in its published image (swebench_images = 'swebench')",
                path=path,
            )
        if how.verify_commits:
            _check_commit(source, base_commit, where, path)
        command = " ".join([own_command or DEFAULT_TEST_COMMAND, *test_directives(repo, test_files, test_patch)])
    instance = SweBenchInstance(
        instance_id=instance_id,
        repo=repo,
        base_commit=base_commit,
        patch=strings["patch"],
        test_patch=test_patch,
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        repo_source=source,
        test_command=command,
        test_files=test_files,
        environment_setup_commit=strings.get("environment_setup_commit"),
        version=version,
        repo_dir=REPO_DIR,
        test_prelude=eval_prelude(repo, version) if image is not None else "",
        parser=parser_for(command),
    )
    metadata = {key: value for key, value in record.items() if key not in (*_REQUIRED, "problem_statement")}
    instruction = instruction_field(record, where, path)
    return Task(
        id=instance_id,
        name=instance_id,
        source=path,
        format="swe-bench",
        instruction=instruction,
        environment=published_environment(image),
        verifier=VerifierSpec(command=command, timeout_s=DEFAULT_TIMEOUT_S, reward="swe-bench"),
        solution=SolutionSpec(command="git apply --verbose -", stdin=instance.patch),
        agent_timeout_s=DEFAULT_TIMEOUT_S,
        metadata=MappingProxyType(metadata),
        swebench=instance,
    )


def _row_to_task(record: object, where: str, how: _Loading) -> Task:
    path = how.path
    where = row_label(where, record)
    if not isinstance(record, Mapping):
        raise InvalidTaskError(f"{where}: an instance must be a JSON object, got {type_name(record)}", path=path)
    kind = row_format(record)
    if kind == "r2e-gym":
        return r2e_gym.to_task(record, where, path)
    if kind == "swe-smith":
        return swe_smith.to_task(record, where, path, how.test_command)
    return _to_task(record, where, how)


def load_swebench_instances(
    path: Path,
    *,
    repos: Path | None = None,
    test_command: str | None = None,
    verify_commits: bool = True,
    images: str | None = AUTO,
) -> tuple[list[Task], list[InvalidTaskError]]:
    """Every instance of a ``.json`` / ``.jsonl`` / ``.parquet`` file of SWE-bench, SWE-Gym, SWE-smith
    or R2E-Gym rows, and the errors of those that are malformed (each naming its row and id).

    ``images`` is ``swebench_images`` (see the module docstring; None: local clones only); ``repos`` is a
    local clone or a mirror directory (default: ``repos/`` next to the file); ``test_command``
    replaces the default test command for instances without their own ``test_cmd`` (SWE-smith's: its
    repository profile's); ``verify_commits`` checks that each base commit is in the clone (one
    ``git`` call each). A file that cannot be read at all, or an ``images`` that is no image set or
    template, raises :class:`~sandrl.errors.InvalidTaskError`.
    """
    path = Path(path)
    try:
        images = images_setting(images)
    except ValueError as exc:
        raise InvalidTaskError(f"{path}: {exc}", path=path) from exc
    mirror = Path(repos) if repos is not None else path.parent / "repos"
    how = _Loading(path, mirror, test_command, verify_commits, images)
    tasks: list[Task] = []
    errors: list[InvalidTaskError] = []
    for where, record in iter_records(path):
        try:
            tasks.append(_row_to_task(record, where, how))
        except InvalidTaskError as exc:
            errors.append(exc)
    return tasks, errors
