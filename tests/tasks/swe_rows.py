"""Rows of SWE-Gym, SWE-smith and R2E-Gym in the shapes their datasets publish, made from the calc
repository of the conftest (``add`` subtracts; a later commit fixes it, a later one adds tests).

- SWE-Gym (``SWE-Gym/SWE-Gym``): SWE-bench's fields, the test lists as real lists, no
  ``environment_setup_commit``; the image ``xingyaoww/sweb.eval.x86_64.<id, __ as _s_>``.
- SWE-smith (``SWE-bench/SWE-smith``): ``patch`` is the bug, ``repo`` SWE-smith's mirror, one
  image per repository holding a clone of the mirror (its instance branches as ``origin/<id>``).
- R2E-Gym (``R2E-Gym/R2E-Gym-Subset``): ``parsed_commit_content`` is the fix in R2E-Gym's
  ``ParsedCommit`` JSON, ``expected_output_json`` the tests' statuses after it; the image has the
  repository at the fix's parent, the tests in ``/r2e_tests`` and ``/testbed/run_tests.sh``.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .conftest import CALC_BASE, CALC_FIXED, FAIL_TO_PASS, PASS_TO_PASS, TEST_MORE, TESTS_ADDED, CalcRepo, git

SWE_GYM_ID = "iterative__dvc-1"
SWE_GYM_IMAGE = "xingyaoww/sweb.eval.x86_64.iterative_s_dvc-1:latest"

SMITH_MIRROR = "swesmith/acme__calc.0123abcd"
SMITH_IMAGE = "swebench/swesmith.x86_64.acme_1776_calc.0123abcd"
SMITH_FALLBACK_ID = "acme__calc.0123abcd.func_pm_op_swap__aaaa1111"
"""An instance whose branch the image does not have: its bug is applied at setup."""
SMITH_BRANCH_ID = "acme__calc.0123abcd.func_pm_op_swap__bbbb2222"
"""An instance whose branch the image has (as ``origin/<id>``), named by no base_commit."""

R2E_REPO = "calc"

CONDA = "conda() { :; }\n"
"""The images' ``/opt/miniconda3/bin/activate``: this host's Python (with pytest) is the ``testbed`` environment."""

R2E_TESTS = """\
from calc import add, mul


def test_mul():
    assert mul(3, 4) == 12


def test_add():
    assert add(2, 3) == 5


class TestAdd:
    def test_commutes(self):
        assert add(2, 7) == add(7, 2)


def test_known_broken():
    assert add(1, 1) == 3  # R2E-Gym keeps tests that fail after the fix too: expected FAILED
"""
R2E_EXPECTED = {
    "test_mul": "PASSED",
    "test_add": "PASSED",
    "TestAdd.test_commutes": "PASSED",
    "test_known_broken": "FAILED",
}
R2E_RUN_TESTS = "PYTHONWARNINGS='ignore::UserWarning' python3 -W ignore -m pytest -rA r2e_tests\n"


def swe_gym_row(calc: CalcRepo, **overrides: object) -> dict[str, object]:
    row = calc.record(instance_id=SWE_GYM_ID, repo="iterative/dvc", version="2.0")
    del row["environment_setup_commit"]
    row["FAIL_TO_PASS"], row["PASS_TO_PASS"] = list(FAIL_TO_PASS), list(PASS_TO_PASS)
    row.update(overrides)
    return row


@dataclass
class SmithMirror:
    """SWE-smith's mirror of calc: one clean commit on main, an instance branch with the bug."""

    path: Path
    bug: str
    """The diff that puts the bug in (the rows' ``patch``)."""
    branch_sha: str


def smith_mirror(root: Path) -> SmithMirror:
    mirror = root / "mirror"
    mirror.mkdir(parents=True)
    git(mirror, "init", "-q", "-b", "main")
    (mirror / "calc.py").write_text(CALC_FIXED)
    (mirror / "test_calc.py").write_text(TESTS_ADDED)
    (mirror / "test_more.py").write_text(TEST_MORE)
    git(mirror, "add", "-A")
    git(mirror, "commit", "-q", "-m", "Initial commit")
    (mirror / "calc.py").write_text(CALC_BASE)
    bug = git(mirror, "diff")
    git(mirror, "checkout", "-q", "-b", SMITH_BRANCH_ID)
    git(mirror, "commit", "-q", "-am", "Bug Patch")
    branch_sha = git(mirror, "rev-parse", "HEAD").strip()
    git(mirror, "checkout", "-q", "main")
    return SmithMirror(mirror, bug, branch_sha)


def smith_testbed(mirror: SmithMirror, dest: Path) -> None:
    """The image's /testbed: a clone of the mirror, so its instance branches are ``origin/<id>``."""
    subprocess.run(["git", "clone", "-q", str(mirror.path), str(dest)], check=True, capture_output=True)


def swe_smith_row(mirror: SmithMirror, instance_id: str = SMITH_FALLBACK_ID, **overrides: object) -> dict[str, object]:
    row: dict[str, object] = {
        "instance_id": instance_id,
        "repo": SMITH_MIRROR,
        "patch": mirror.bug,
        "FAIL_TO_PASS": list(FAIL_TO_PASS),
        # A test of another file is not run, so not graded (as SWE-smith's harness).
        "PASS_TO_PASS": [*PASS_TO_PASS, "tests/test_elsewhere.py::test_other"],
        "created_at": "2025-04-01T00:00:00",
        "image_name": SMITH_IMAGE,
        "base_commit": "e" * 40,  # the bug's commit on its branch, which this image has not
        "problem_statement": "add() gives the difference of its arguments, not their sum.\n",
    }
    row.update(overrides)
    return row


# --- R2E-Gym -----------------------------------------------------------------------------------


@dataclass
class R2eCommit:
    """The fix as R2E-Gym records it: a commit on top of calc's buggy one."""

    old: str
    new: str
    diff: str


def r2e_commit(calc: CalcRepo, root: Path) -> R2eCommit:
    repo = root / "r2e-repo"
    subprocess.run(["git", "clone", "-q", str(calc.source), str(repo)], check=True, capture_output=True)
    git(repo, "checkout", "-q", calc.base)
    (repo / "calc.py").write_text(CALC_FIXED)
    (repo / "README.md").write_text("calc: add and mul\n")  # not Python: not in the reference solution
    git(repo, "commit", "-q", "-am", "fix add")
    new = git(repo, "rev-parse", "HEAD").strip()
    return R2eCommit(old=calc.base, new=new, diff=git(repo, "diff", calc.base, new))


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")


def _range(start: str, length: str | None) -> dict[str, object]:
    return {"start": int(start), "length": None if length is None else int(length)}


def parsed_commit(commit: R2eCommit) -> dict[str, object]:
    """``commit`` as R2E-Gym's ``ParsedCommit`` (what ``parsed_commit_content`` holds, as JSON)."""
    diffs: list[dict[str, object]] = []
    for chunk in re.split(r"(?m)^(?=diff --git )", commit.diff):
        if not chunk.startswith("diff --git "):
            continue
        lines = chunk.splitlines()
        path = lines[0].split(" b/", 1)[1]
        header: dict[str, object] = {"file": {"path": path}, "misc_line": None}
        diff: dict[str, object] = {
            "old_file_content": "",
            "new_file_content": "",
            "header": header,
            "index_line": None,
            "is_binary_file": False,
            "binary_line": None,
            "minus_file": None,
            "plus_file": None,
            "hunks": [],
        }
        hunks: list[dict[str, object]] = []
        for line in lines[1:]:
            match = _HUNK.match(line)
            if match:
                descriptor = {
                    "old_range": _range(match.group(1), match.group(2)),
                    "new_range": _range(match.group(3), match.group(4)),
                    "section": match.group(5),
                }
                hunks.append({"descriptor": descriptor, "line_group": {"all_lines": []}})
            elif hunks:
                kind = {" ": "context", "+": "added", "-": "deleted", "\\": "note"}[line[:1] or " "]
                content = line[2:] if kind == "note" else line[1:]
                hunks[-1]["line_group"]["all_lines"].append({"content": content, "type": kind})
            elif line.startswith("index "):
                old, rest = line[len("index ") :].split("..")
                new, _, mode = rest.partition(" ")
                diff["index_line"] = {"old_commit_hash": old, "new_commit_hash": new, "mode": mode}
            elif line.startswith("--- "):
                diff["minus_file"] = {"path": line[4:]}
            elif line.startswith("+++ "):
                diff["plus_file"] = {"path": line[4:]}
            else:
                header["misc_line"] = line
        diff["hunks"] = hunks
        diffs.append(diff)
    return {
        "file_diffs": diffs,
        "old_commit_hash": commit.old,
        "new_commit_hash": commit.new,
        "commit_message": "fix add",
        "commit_date": "2024-01-01T00:00:00",
        "metadata": {},
    }


def r2e_row(commit: R2eCommit, **overrides: object) -> dict[str, object]:
    row: dict[str, object] = {
        "repo_name": R2E_REPO,
        "docker_image": f"namanjain12/calc_final:{commit.new}",
        "commit_hash": commit.new,
        "parsed_commit_content": json.dumps(parsed_commit(commit)),
        "execution_result_content": json.dumps({"repo_name": R2E_REPO, "new_commit_hash": commit.new}),
        "modified_files": ["calc.py"],
        "modified_entity_summaries": [],
        "relevant_files": ["calc.py"],
        "num_non_test_files": 1,
        "num_non_test_func_methods": 1,
        "num_non_test_lines": 1,
        "prompt": "Fix the issue.",
        "problem_statement": "add() subtracts: add(2, 3) is -1, not 5.\n",
        "expected_output_json": json.dumps(R2E_EXPECTED),
    }
    row.update(overrides)
    return row


def write_rows(path: Path, rows: list[dict[str, object]]) -> Path:
    """Rows as their dataset publishes them: Parquet (Hugging Face's shards), else JSONL or JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        path.write_text(json.dumps(rows))
    return path
