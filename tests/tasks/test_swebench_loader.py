"""Reading SWE-bench instances: both list spellings, both file forms, the repository source, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandrl.errors import InvalidTaskError
from sandrl.tasks import load_swebench_instances, load_task
from sandrl.tasks.swebench import patch_files

from .conftest import FAIL_TO_PASS, PASS_TO_PASS, CalcRepo


def test_jsonl_instance_becomes_a_task(calc_repo: CalcRepo, tmp_path: Path) -> None:
    file = calc_repo.write(calc_repo.mirror.parent / "instances.jsonl", calc_repo.record())
    task = load_task(file)  # repos/ next to the file is the default mirror
    assert (task.id, task.format, task.source) == ("acme__calc-1", "swe-bench", file)
    assert task.instruction == "add() subtracts instead of adding.\n"
    instance = task.swebench
    assert instance is not None
    assert instance.repo_source == calc_repo.source
    assert instance.fail_to_pass == tuple(FAIL_TO_PASS)  # decoded from the JSON string
    assert instance.pass_to_pass == tuple(PASS_TO_PASS)  # given as a real list
    assert instance.test_files == ("test_calc.py", "test_more.py")
    assert instance.test_command == "pytest -rA test_calc.py test_more.py"
    assert (instance.version, instance.environment_setup_commit) == ("1.0", calc_repo.base)
    assert task.environment.workdir == "/testbed" and task.environment.allow_internet is False
    assert task.verifier.reward == "swe-bench"
    assert task.solution is not None and task.solution.stdin == calc_repo.patch
    assert task.metadata["hints_text"] == "" and task.metadata["created_at"] == "2024-01-01T00:00:00Z"


def test_json_list_many_instances_and_explicit_sources(calc_repo: CalcRepo, tmp_path: Path) -> None:
    records = [calc_repo.record(), calc_repo.record(instance_id="acme__calc-2", test_cmd="python -m pytest -x -rA")]
    file = calc_repo.write(tmp_path / "elsewhere.json", *records)
    # A single clone given directly works as well as a mirror.
    tasks, errors = load_swebench_instances(file, repos=calc_repo.source, test_command="pytest -q -rA")
    assert errors == []
    assert [t.id for t in tasks] == ["acme__calc-1", "acme__calc-2"]
    assert tasks[0].swebench is not None and tasks[0].swebench.test_command.startswith("pytest -q -rA ")
    assert tasks[1].swebench is not None and tasks[1].swebench.test_command.startswith("python -m pytest -x -rA ")
    with pytest.raises(InvalidTaskError, match="holds 2 instances, not one"):
        load_task(file, repos=calc_repo.mirror)


def test_non_test_files_are_left_out_of_the_test_command() -> None:
    patch = "diff --git a/tests/data.json b/tests/data.json\ndiff --git a/tests/test_x.py b/tests/test_x.py\n"
    assert patch_files(patch) == ("tests/data.json", "tests/test_x.py")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"instance_id": None}, r"missing instance_id"),
        ({"repo": 5}, r"repo must be a string, got an integer"),
        ({"repo": "no-slash"}, r"repo must be 'owner/name'"),
        ({"base_commit": "HEAD~1"}, r"base_commit must be a commit sha"),
        ({"FAIL_TO_PASS": "[not json"}, r"FAIL_TO_PASS is a string but not a JSON list"),
        ({"PASS_TO_PASS": {"a": 1}}, r"PASS_TO_PASS must be a list of test ids"),
        ({"FAIL_TO_PASS": []}, r"FAIL_TO_PASS is empty"),
        ({"test_patch": ""}, r"test_patch is empty"),
        ({"problem_statement": None}, r"problem_statement is missing or empty"),
        ({"base_commit": "0" * 40}, r"commit 0{40} is not in .*acme__calc"),
    ],
)
def test_malformed_instances_are_reported_one_by_one(
    calc_repo: CalcRepo, tmp_path: Path, overrides: dict[str, object], expected: str
) -> None:
    bad = calc_repo.record(**{"instance_id": "bad", **overrides})
    for key in [key for key, value in overrides.items() if value is None]:
        del bad[key]  # None stands for "the key is absent"
    file = calc_repo.write(calc_repo.mirror.parent / "mixed.jsonl", calc_repo.record(), bad)
    tasks, errors = load_swebench_instances(file)
    assert [t.id for t in tasks] == ["acme__calc-1"]  # the good one still loads
    assert len(errors) == 1
    assert f"{file}:2" in str(errors[0])  # file and line
    assert errors[0].path == file
    with pytest.raises(InvalidTaskError, match=expected):
        raise errors[0]


def test_unreadable_files(tmp_path: Path) -> None:
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text('{"instance_id": "a"}\n{oops\n')
    with pytest.raises(InvalidTaskError, match=r"bad\.jsonl:2: is not valid JSON"):
        load_swebench_instances(bad_line)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("[1, 2")
    with pytest.raises(InvalidTaskError, match=r"bad\.json: is not valid JSON"):
        load_swebench_instances(bad_json)
    not_objects = tmp_path / "numbers.json"
    not_objects.write_text(json.dumps([1]))
    _, errors = load_swebench_instances(not_objects)
    assert "an instance must be a JSON object, got an integer" in str(errors[0])


def test_without_a_local_clone_an_instance_runs_in_its_published_image(calc_repo: CalcRepo) -> None:
    """Unset swebench_images: the clone when there is one, else the image; "local" insists on a clone."""
    absent = calc_repo.record(instance_id="acme__absent-7", repo="acme/absent")
    file = calc_repo.write(calc_repo.mirror.parent / "auto.jsonl", calc_repo.record(), absent)
    tasks, errors = load_swebench_instances(file)
    assert errors == []
    by_id = {t.id: t for t in tasks}
    assert by_id["acme__calc-1"].environment.docker_image is None  # the clone
    assert by_id["acme__absent-7"].environment.docker_image == "swebench/sweb.eval.x86_64.acme_1776_absent-7:latest"
    tasks, errors = load_swebench_instances(file, images="local")
    assert [t.id for t in tasks] == ["acme__calc-1"]
    with pytest.raises(
        InvalidTaskError, match=r"no local copy of acme/absent .*git clone https://github.com/acme/absent"
    ):
        raise errors[0]
