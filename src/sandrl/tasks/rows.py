"""Instance rows: the files SWE-style datasets are published as, and which dataset each row is from.

A file holds rows: a ``.json`` list (or one object), ``.jsonl`` (one object a line), or
``.parquet`` (how Hugging Face publishes datasets: ``data/train-00000-of-00003.parquet``; read with
pyarrow, batch by batch). Each row is told by its keys (:func:`row_format`):

- **R2E-Gym** (``R2E-Gym/R2E-Gym-Subset``...): ``repo_name``, ``docker_image``, ``commit_hash``;
- **SWE-smith** (``SWE-bench/SWE-smith``...): ``instance_id`` and ``image_name``, no ``test_patch``;
- **SWE-bench** and **SWE-Gym** (``SWE-Gym/SWE-Gym``: SWE-bench's shape): everything else.

The fields every format shares are checked here, with messages that name the row (its file and
line or index, and its id) and the fix.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from sandrl.errors import ConfigError, InvalidTaskError
from sandrl.images.reference import parse_reference
from sandrl.tasks.task import EnvironmentSpec
from sandrl.toml_config import type_name

REPO_DIR = "/testbed"
"""Where every one of these images has the repository."""
DEFAULT_TIMEOUT_S = 1800.0
"""SWE-bench's evaluation timeout; the agent gets the same by default."""
ROW_SUFFIXES = (".json", ".jsonl", ".parquet")
PARQUET_BATCH_ROWS = 64
"""Rows decoded at once from a Parquet file (a row of R2E-Gym carries whole source files)."""

RowFormat = Literal["swe-bench", "swe-smith", "r2e-gym"]

_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
_SHA = re.compile(r"^[0-9a-f]{7,64}$")


def parse_json(text: str) -> object:
    """``json.loads``, with nesting too deep for the parser a :class:`json.JSONDecodeError` like any
    other bad JSON (it raises RecursionError, which would end the whole load)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text[:1000], 0) from None


def is_row_file(path: Path) -> bool:
    return path.is_file() and path.suffix in ROW_SUFFIXES


def _parquet_rows(path: Path) -> Iterator[tuple[str, object]]:
    try:
        parquet: Any = importlib.import_module("pyarrow.parquet")  # no type stubs; an optional dependency
        arrow_error: type[Exception] = importlib.import_module("pyarrow").ArrowException
    except ImportError as exc:
        raise InvalidTaskError(
            f"{path}: reading Parquet needs pyarrow, which is not installed: pip install pyarrow "
            "(or convert the file to JSONL)",
            path=path,
        ) from exc
    try:
        table = parquet.ParquetFile(str(path))
        index = 0
        for batch in table.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for row in batch.to_pylist():
                yield f"{path}[row {index}]", row
                index += 1
    except (OSError, arrow_error) as exc:
        raise InvalidTaskError(f"{path}: is not a readable Parquet file ({exc})", path=path) from exc


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidTaskError(f"{path}: cannot be read ({exc})", path=path) from exc


def _jsonl_rows(path: Path) -> Iterator[tuple[str, object]]:
    for number, line in enumerate(_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield f"{path}:{number}", parse_json(line)
        except json.JSONDecodeError as exc:
            raise InvalidTaskError(
                f"{path}:{number}: is not valid JSON ({exc.msg}); a .jsonl file holds one instance object per line",
                path=path,
            ) from exc


def iter_records(path: Path) -> Iterator[tuple[str, object]]:
    """The rows of a file, each with a label for messages (``file:line``, ``file[index]``, ``file[row n]``)."""
    if path.suffix == ".parquet":
        yield from _parquet_rows(path)
        return
    if path.suffix == ".jsonl":
        yield from _jsonl_rows(path)
        return
    try:
        data = parse_json(_text(path))
    except json.JSONDecodeError as exc:
        raise InvalidTaskError(f"{path}: is not valid JSON ({exc})", path=path) from exc
    items = data if isinstance(data, list) else [data]
    for index, item in enumerate(items):
        yield f"{path}[{index}]", item


def read_records(path: Path) -> list[tuple[str, object]]:
    """Every row of a file (see :func:`iter_records`); a file that cannot be read raises."""
    return list(iter_records(path))


def first_record(path: Path) -> object:
    """The file's first row, None for an empty file; a file that cannot be read raises."""
    for _, record in iter_records(path):
        return record
    return None


def row_format(record: Mapping[str, object]) -> RowFormat:
    """Which dataset a row is from, by its keys (see the module)."""
    if "repo_name" in record and "docker_image" in record and "commit_hash" in record:
        return "r2e-gym"
    if "image_name" in record and "test_patch" not in record:
        return "swe-smith"
    return "swe-bench"


def looks_like_row(record: object) -> bool:
    """Whether a file's first record is an instance row of any format (a file of other JSON is not)."""
    return isinstance(record, Mapping) and ("instance_id" in record or row_format(record) == "r2e-gym")


def r2e_gym_id(repo_name: str, commit_hash: str) -> str:
    """The id of an R2E-Gym row, which has none of its own: ``<repo_name>__<commit_hash>``."""
    return f"{repo_name}__{commit_hash}"


def row_label(where: str, record: object) -> str:
    """``where`` with the row's id, when it has one that reads as an id."""
    if not isinstance(record, Mapping):
        return where
    ident = record.get("instance_id")
    if not isinstance(ident, str) and row_format(record) == "r2e-gym":
        name, commit = record.get("repo_name"), record.get("commit_hash")
        ident = r2e_gym_id(name, commit) if isinstance(name, str) and isinstance(commit, str) else None
    if not isinstance(ident, str) or not ident.strip():
        return where
    shown = ident if len(ident) <= 120 else ident[:117] + "..."
    return f"{where} ({shown!r})"


# --- fields --------------------------------------------------------------------------------------


def string_field(record: Mapping[str, object], key: str, where: str, path: Path) -> str:
    """A field that must be a string (present: the caller checked the row has it)."""
    value = record.get(key)
    if not isinstance(value, str):
        raise InvalidTaskError(f"{where}: {key} must be a string, got {type_name(value)}", path=path)
    return value


def optional_string(record: Mapping[str, object], key: str, where: str, path: Path) -> str | None:
    return None if record.get(key) is None else string_field(record, key, where, path)


def require(record: Mapping[str, object], keys: tuple[str, ...], where: str, path: Path, what: str) -> None:
    missing = [key for key in keys if key not in record]
    if missing:
        raise InvalidTaskError(f"{where}: missing {', '.join(missing)}; {what} has {', '.join(keys)}", path=path)


def sha_field(value: str, key: str, where: str, path: Path) -> str:
    if not _SHA.match(value):
        raise InvalidTaskError(f"{where}: {key} must be a commit sha, got {value[:80]!r}", path=path)
    return value


def test_list(record: Mapping[str, object], key: str, where: str, path: Path) -> tuple[str, ...]:
    """FAIL_TO_PASS / PASS_TO_PASS: a list of test ids, or a JSON string of one (SWE-bench's spelling)."""
    value = record[key]
    if isinstance(value, str):
        try:
            value = parse_json(value)
        except json.JSONDecodeError as exc:
            raise InvalidTaskError(
                f"{where}: {key} is a string but not a JSON list ({exc.msg}); write it as a list of test ids",
                path=path,
            ) from exc
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InvalidTaskError(
            f"{where}: {key} must be a list of test ids (or a JSON string of one), got {type_name(value)}", path=path
        )
    return tuple(value)


def instruction_field(record: Mapping[str, object], where: str, path: Path) -> str:
    text = record.get("problem_statement")
    if not isinstance(text, str) or not text.strip():
        raise InvalidTaskError(
            f"{where}: problem_statement is missing or empty; it is what the agent is told", path=path
        )
    return text


def image_field(record: Mapping[str, object], key: str, where: str, path: Path) -> str:
    """A registry reference (``name[:tag][@digest]``) the row's sandboxes start from."""
    image = string_field(record, key, where, path)
    try:
        parse_reference(image)
    except ConfigError as exc:
        raise InvalidTaskError(f"{where}: {key}: {exc}", path=path) from exc
    return image


def patch_files(patch: str) -> tuple[str, ...]:
    """The files a diff touches, in order, as ``git apply`` sees them."""
    seen: dict[str, None] = {}
    for match in _DIFF_HEADER.finditer(patch):
        seen[match.group(2)] = None
    return tuple(seen)


def published_environment(image: str | None) -> EnvironmentSpec:
    """Where a SWE-style instance runs: its image, the repository at :data:`REPO_DIR`, no network
    (the environment is complete; grading must not depend on the network)."""
    return EnvironmentSpec(
        docker_image=image,
        base_image=image,
        cpus=1.0,
        memory_mb=4096,
        storage_mb=10240,
        allow_internet=False,
        workdir=REPO_DIR,
    )
