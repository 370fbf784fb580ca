"""A task's built image is named after the task, and ``sandrl images prune`` offers to remove such images."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import sandrl.sandbox.bwrap.provider
from sandrl.cli import app
from sandrl.sandbox.bwrap.dockerfile.names import task_image_name
from sandrl.sandbox.bwrap.images import ImageStore

from .conftest import REASON


def test_a_task_image_name_is_the_tasks_id_made_a_store_name(tmp_path: Path) -> None:
    key = "0123456789abcdef" * 4
    assert task_image_name("count-words", key) == "task-count-words-0123456789abcdef"
    assert task_image_name("SWE-Gym/Django__django-11099", key) == "task-swe-gym-django__django-11099-0123456789abcdef"
    long = task_image_name("x" * 300, key)
    assert len(long) <= 128 and long.endswith("-0123456789abcdef")
    assert task_image_name("../..//", key) == "task-unnamed-0123456789abcdef"
    for name in (long, task_image_name("Ünïcode tåsk", key)):
        ImageStore(tmp_path / "images").check_name(name)  # a name the store takes


def _task(root: Path, name: str) -> None:
    task = root / name
    for d in ("environment", "tests", "solution"):
        (task / d).mkdir(parents=True)
    (task / "task.toml").write_text("[verifier]\ntimeout_sec = 30.0\n")
    (task / "instruction.md").write_text("Write 3 to /workspace/n.\n")
    (task / "environment" / "Dockerfile").write_text(
        f"FROM host\nRUN mkdir -p /opt/{name} && echo ready > /opt/{name}/state\nWORKDIR /workspace\n"
    )
    (task / "solution" / "solve.sh").write_text("echo 3 > /workspace/n\n")
    (task / "tests" / "test.sh").write_text(
        f"mkdir -p /logs/verifier\ngrep -q ready /opt/{name}/state && grep -qx 3 /workspace/n "
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    )


def _run(args: list[str], input: str | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, args, input=input, env={"COLUMNS": "200"})
    return result.exit_code, result.output


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_a_tasks_image_is_named_after_it_and_prune_offers_to_remove_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    monkeypatch.setattr(sandrl.sandbox.bwrap.provider, "DEFAULT_STATE_DIR", state)
    _task(tmp_path / "tasks", "count-words")
    code, output = _run(["tasks", "run", str(tmp_path / "tasks"), "--json"])
    assert code == 0, output
    (result,) = json.loads(output.strip().splitlines()[-1])["results"]
    assert result["reward"] == 1.0, output
    image = result["image"]
    assert re.fullmatch(r"task-count-words-[0-9a-f]{16}", image), image
    code, output = _run(["images", "ls"])
    assert code == 0 and image in output and "task count-words" in output, output

    for answer in ("n\n", ""):  # declined, or nobody to answer: nothing goes
        code, output = _run(["images", "prune"], input=answer)
        assert code == 1 and ("nothing removed" in output or "Aborted" in output), output
        assert re.search(r"task images[\s│|]+1[\s│|]+\d+(\.\d)? (B|KiB)", output), output
        assert re.search(r"build cache images[\s│|]+1[\s│|]", output), output
        assert f"task images: {image}" in output  # named
        assert ImageStore(state / "images").exists(image)

    code, output = _run(["images", "prune", "--yes"])
    assert code == 0, output
    done = json.loads(output.strip().splitlines()[-1])
    assert (done["task_images"], done["cache_images"], done["dry_run"]) == (1, 1, False)
    assert done["layers"] >= 1 and done["freed_mb"] >= 0
    store = ImageStore(state / "images")
    assert not store.exists(image) and [n for n in store.names() if n != "host"] == []
    code, output = _run(["images", "prune"])
    assert code == 0 and "nothing to prune" in output, output
