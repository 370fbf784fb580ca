"""R2E-Gym instances (``R2E-Gym/R2E-Gym-Subset``, ``R2E-Gym-Lite``... on Hugging Face).

A row (R2E-Gym's ``DatasetRow``): ``repo_name`` (its short name: ``pandas``, ``aiohttp``...),
``docker_image`` (one image per instance, ``namanjain12/<repo>_final:<commit_hash>``),
``commit_hash`` (the commit that fixed the bug), ``parsed_commit_content`` (that commit as JSON:
R2E-Gym's ``ParsedCommit``, its file diffs hunk by hunk), ``problem_statement``,
``expected_output_json`` (each test's status after the fix) and statistics (``modified_files``,
``num_non_test_lines``...), kept as metadata. It has no id of its own: the task's is
``<repo_name>__<commit_hash>`` (or the row's ``instance_id``, which some exports add).

The image has the repository at ``/testbed`` checked out at the fix's parent, its environment in
``/testbed/.venv``, the tests in ``/r2e_tests`` and ``/testbed/run_tests.sh`` to run them (``pytest
-rA r2e_tests``). The oracle applies the commit's Python diffs (R2E-Gym's ``ParsedCommit.get_patch``,
as its validation does, with ``git apply --whitespace=fix``). Setup and grading:
:mod:`sandrl.tasks.r2e_gym_eval`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from sandrl.errors import InvalidTaskError
from sandrl.tasks.rows import (
    REPO_DIR,
    image_field,
    instruction_field,
    parse_json,
    published_environment,
    r2e_gym_id,
    require,
    sha_field,
    string_field,
)
from sandrl.tasks.task import R2eGymInstance, SolutionSpec, Task, VerifierSpec
from sandrl.toml_config import type_name

STATUSES = ("PASSED", "FAILED", "ERROR")
"""The statuses R2E-Gym's log parser gives a test (skips and expected failures are not kept)."""
TESTS_TIMEOUT_S = 600.0
"""R2E-Gym runs the tests with 300 s; twice that, as sandboxes get one CPU."""
AGENT_TIMEOUT_S = 1800.0
EXPECTED_MAX_TESTS = 100_000

_REQUIRED = (
    "repo_name",
    "docker_image",
    "commit_hash",
    "parsed_commit_content",
    "problem_statement",
    "expected_output_json",
)
_BULKY = ("parsed_commit_content", "execution_result_content", "prompt", "problem_statement", "expected_output_json")
"""Fields not kept as metadata: whole source files and logs, or kept elsewhere."""
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,199}$")
_ANSI_KEY = re.compile(r"\x1b\[\d+m")
_LINE_PREFIX = {"context": " ", "added": "+", "deleted": "-", "note": "\\ "}


def test_key(name: str) -> str:
    """A test's name as R2E-Gym compares them: colours removed, a `` - message`` dropped."""
    return _ANSI_KEY.sub("", name).split(" - ")[0]


class _Malformed(ValueError):
    """Where in ``parsed_commit_content`` it is not R2E-Gym's ``ParsedCommit``."""


def _get(node: object, key: str, kind: type, at: str, *, optional: bool = False) -> object:
    if not isinstance(node, Mapping):
        raise _Malformed(f"{at} must be an object, got {type_name(node)}")
    value = node.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _Malformed(f"{at}.{key} must be {kind.__name__}, got {type_name(value)}")
    return value


def _range(node: object, at: str) -> str:
    start = _get(node, "start", int, at)
    length = _get(node, "length", int, at, optional=True)
    return f"{start}" if length is None else f"{start},{length}"


def _file_patch(diff: object, at: str) -> str:
    """One file's diff, rebuilt as R2E-Gym's ``FileDiff.get_patch`` writes it."""
    header = _get(diff, "header", Mapping, at)
    file_path = _get(_get(header, "file", Mapping, f"{at}.header"), "path", str, f"{at}.header.file")
    patch = f"diff --git a/{file_path} b/{file_path}\n"
    misc = _get(header, "misc_line", str, f"{at}.header", optional=True)
    if misc:
        patch += f"{misc}\n"
    index = _get(diff, "index_line", Mapping, at, optional=True)
    if index is not None:
        old, new = (_get(index, key, str, f"{at}.index_line") for key in ("old_commit_hash", "new_commit_hash"))
        mode = _get(index, "mode", str, f"{at}.index_line", optional=True) or ""
        patch += f"index {old}..{new}{' ' if mode else ''}{mode}\n"
    if _get(diff, "is_binary_file", bool, at, optional=True):
        patch += f"{_get(diff, 'binary_line', str, at)}\n"
    minus = _get(diff, "minus_file", Mapping, at, optional=True)
    plus = _get(diff, "plus_file", Mapping, at, optional=True)
    if minus is not None and plus is not None:
        patch += f"--- {_get(minus, 'path', str, f'{at}.minus_file')}\n"
        patch += f"+++ {_get(plus, 'path', str, f'{at}.plus_file')}\n"
    hunks = _get(diff, "hunks", list, at, optional=True) or []
    assert isinstance(hunks, list)
    for h, hunk in enumerate(hunks):
        where = f"{at}.hunks[{h}]"
        descriptor = _get(hunk, "descriptor", Mapping, where)
        old_range = _range(_get(descriptor, "old_range", Mapping, f"{where}.descriptor"), f"{where}.descriptor")
        new_range = _range(_get(descriptor, "new_range", Mapping, f"{where}.descriptor"), f"{where}.descriptor")
        section = _get(descriptor, "section", str, f"{where}.descriptor", optional=True)
        patch += f"@@ -{old_range} +{new_range} @@" + (f" {section}" if section else "") + "\n"
        lines = _get(_get(hunk, "line_group", Mapping, where), "all_lines", list, f"{where}.line_group")
        assert isinstance(lines, list)
        for n, line in enumerate(lines):
            kind = _get(line, "type", str, f"{where}.line_group.all_lines[{n}]")
            prefix = _LINE_PREFIX.get(str(kind))
            if prefix is None:
                raise _Malformed(
                    f"{where}.line_group.all_lines[{n}].type must be one of {', '.join(_LINE_PREFIX)}, got {kind!r}"
                )
            patch += f"{prefix}{_get(line, 'content', str, f'{where}.line_group.all_lines[{n}]')}\n"
    return patch


def gold_patch(parsed_commit: Mapping[str, object]) -> str:
    """The commit's diff of its Python files (``ParsedCommit.get_patch()``'s defaults); ValueError if malformed."""
    diffs = _get(parsed_commit, "file_diffs", list, "parsed_commit_content")
    assert isinstance(diffs, list)
    patch = ""
    for i, diff in enumerate(diffs):
        at = f"parsed_commit_content.file_diffs[{i}]"
        path = _get(_get(_get(diff, "header", Mapping, at), "file", Mapping, f"{at}.header"), "path", str, at)
        if str(path).endswith(".py"):
            patch += _file_patch(diff, at)
    return patch


def _expected(text: str, where: str, path: Path) -> dict[str, str]:
    try:
        data = parse_json(text)
    except json.JSONDecodeError as exc:
        raise InvalidTaskError(f"{where}: expected_output_json is not JSON ({exc.msg})", path=path) from exc
    if not isinstance(data, dict):
        raise InvalidTaskError(
            f"{where}: expected_output_json must be a JSON object of test name → status, got {type_name(data)}",
            path=path,
        )
    if not data:
        raise InvalidTaskError(f"{where}: expected_output_json is empty, so no test shows the fix works", path=path)
    if len(data) > EXPECTED_MAX_TESTS:
        raise InvalidTaskError(
            f"{where}: expected_output_json names {len(data)} tests, over {EXPECTED_MAX_TESTS}", path=path
        )
    expected: dict[str, str] = {}
    for name, status in data.items():
        if status not in STATUSES:
            raise InvalidTaskError(
                f"{where}: expected_output_json gives {name[:120]!r} the status {status!r}, not one of "
                f"{', '.join(STATUSES)}",
                path=path,
            )
        expected[test_key(name)] = status
    return expected


def to_task(record: Mapping[str, object], where: str, path: Path) -> Task:
    """The task of one R2E-Gym row (``where`` names it in errors); raises InvalidTaskError for a bad row."""
    require(record, _REQUIRED, where, path, "an R2E-Gym instance")
    repo_name = string_field(record, "repo_name", where, path)
    if not _NAME.match(repo_name):
        raise InvalidTaskError(f"{where}: repo_name must be a name like 'pandas', got {repo_name[:120]!r}", path=path)
    commit = sha_field(string_field(record, "commit_hash", where, path), "commit_hash", where, path)
    image = image_field(record, "docker_image", where, path)
    instruction = instruction_field(record, where, path)
    expected = _expected(string_field(record, "expected_output_json", where, path), where, path)
    try:
        parsed = parse_json(string_field(record, "parsed_commit_content", where, path))
        old = _get(parsed, "old_commit_hash", str, "parsed_commit_content")
        assert isinstance(parsed, Mapping)  # _get said so
        patch = gold_patch(parsed)
    except (json.JSONDecodeError, _Malformed) as exc:
        raise InvalidTaskError(
            f"{where}: parsed_commit_content is not R2E-Gym's parsed commit: {exc}", path=path
        ) from exc
    old_commit = sha_field(str(old), "parsed_commit_content.old_commit_hash", where, path)
    if not patch:
        raise InvalidTaskError(
            f"{where}: parsed_commit_content changes no Python file, so there is no reference solution", path=path
        )
    ident = record.get("instance_id")
    task_id = ident if isinstance(ident, str) else r2e_gym_id(repo_name, commit)
    if not _ID.match(task_id):
        raise InvalidTaskError(f"{where}: instance_id must be letters, digits, '_', '.', '@' and '-'", path=path)
    instance = R2eGymInstance(
        repo_name=repo_name,
        commit_hash=commit,
        old_commit=old_commit,
        expected=MappingProxyType(expected),
        repo_dir=REPO_DIR,
    )
    metadata = {key: value for key, value in record.items() if key not in _BULKY}
    return Task(
        id=task_id,
        name=task_id,
        source=path,
        format="r2e-gym",
        instruction=instruction,
        environment=published_environment(image),
        verifier=VerifierSpec(command=f"bash {instance.run_tests}", timeout_s=TESTS_TIMEOUT_S, reward="r2e-gym"),
        solution=SolutionSpec(command="git apply --whitespace=fix -", stdin=patch),
        agent_timeout_s=AGENT_TIMEOUT_S,
        metadata=MappingProxyType(metadata),
        r2e_gym=instance,
    )
