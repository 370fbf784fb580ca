"""SWE-bench instances in their published images: the image of each instance, the harness's test
command and eval script, the Django and SymPy log parsers, and grading where the image holds the
repository (the image itself is the sandbox provider's to pull; here its /testbed is made by hand)."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from sandrl.errors import ConfigError, InvalidTaskError, TaskError
from sandrl.tasks import load_swebench_instances, load_task, load_tasks, prepare_environment, verify
from sandrl.tasks.pytest_results import TestStatus
from sandrl.tasks.sandbox_io import extract_tar
from sandrl.tasks.swebench_eval import eval_command, grade_statuses, repository_snapshot
from sandrl.tasks.swebench_logs import parse_django_log, parse_sympy_log
from sandrl.tasks.swebench_specs import CONDA_ACTIVATE, instance_image
from sandrl.tasks.task import SweBenchInstance
from sandrl.wiring.config import TasksConfig
from sandrl.wiring.evaluate import EvalConfig

from .conftest import CalcRepo, SandboxFactory


@pytest.mark.parametrize(
    ("instance_id", "images", "arch", "image"),
    [
        # The harness's instance_image_key with namespace "swebench": lower case, "__" as "_1776_".
        ("django__django-11099", "swebench", "x86_64", "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"),
        (
            "Sphinx-Doc__Sphinx-8721",
            "swebench",
            "x86_64",
            "swebench/sweb.eval.x86_64.sphinx-doc_1776_sphinx-8721:latest",
        ),
        ("astropy__astropy-12907", "swebench", "arm64", "swebench/sweb.eval.arm64.astropy_1776_astropy-12907:latest"),
        # Epoch AI's: the id as it is.
        (
            "django__django-11099",
            "epoch",
            "x86_64",
            "ghcr.io/epoch-research/swe-bench.eval.x86_64.django__django-11099",
        ),
        (
            "django__django-11099",
            "mirror.local:5000/{instance_key}:v2",
            "x86_64",
            "mirror.local:5000/django_1776_django-11099:v2",
        ),
        ("django__django-11099", "r.example/{arch}/{instance_id}", "arm64", "r.example/arm64/django__django-11099"),
    ],
)
def test_the_published_image_of_an_instance(instance_id: str, images: str, arch: str, image: str) -> None:
    assert instance_image(instance_id, images, arch=arch) == image


@pytest.mark.parametrize("images", ["dockerhub", "registry.example/fixed:latest", "r/{instance_id}/{tag}"])
def test_an_image_setting_that_is_none_is_refused(calc_repo: CalcRepo, images: str) -> None:
    file = calc_repo.write(calc_repo.mirror.parent / "one.jsonl", calc_repo.record())
    with pytest.raises(InvalidTaskError, match=r"swebench_images must be 'swebench', 'epoch'"):
        load_swebench_instances(file, images=images)
    with pytest.raises(ConfigError, match=r"swebench_images must be"):
        TasksConfig(path=str(file), swebench_images=images)
    with pytest.raises(ConfigError, match=r"--swebench-images: swebench_images must be"):
        EvalConfig(str(file), swebench_images=images)


DJANGO_TEST_PATCH = """\
diff --git a/tests/forms_tests/tests/test_input_formats.py b/tests/forms_tests/tests/test_input_formats.py
--- a/tests/forms_tests/tests/test_input_formats.py
+++ b/tests/forms_tests/tests/test_input_formats.py
@@ -1 +1,2 @@
 x = 1
+y = 2
diff --git a/tests/forms_tests/fixtures/data.json b/tests/forms_tests/fixtures/data.json
--- a/tests/forms_tests/fixtures/data.json
+++ b/tests/forms_tests/fixtures/data.json
@@ -1 +1 @@
-{}
+{"a": 1}
"""


def _published(calc_repo: CalcRepo, tmp_path: Path, images: str = "swebench", **overrides: object) -> SweBenchInstance:
    # No clone of the repository anywhere: the image has it.
    file = calc_repo.write(tmp_path / "published.jsonl", calc_repo.record(**overrides))
    tasks, errors = load_swebench_instances(file, images=images)
    assert errors == []
    (task,) = tasks
    assert task.swebench is not None
    return task.swebench


def test_a_django_instance_gets_its_image_and_the_harness_test_command(calc_repo: CalcRepo, tmp_path: Path) -> None:
    instance = _published(
        calc_repo,
        tmp_path,
        repo="django/django",
        instance_id="django__django-12345",
        version="3.0",
        test_patch=DJANGO_TEST_PATCH,
    )
    assert instance.repo_source is None and instance.repo_dir == "/testbed"
    # runtests.py on module names: tests/ and .py dropped, / as . (the data file is left out).
    assert instance.test_command == (
        "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 forms_tests.tests.test_input_formats"
    )
    assert instance.parser == "django"
    assert instance.test_prelude.splitlines() == [
        CONDA_ACTIVATE,
        "sed -i '/en_US.UTF-8/s/^# //g' /etc/locale.gen && locale-gen",
        "export LANG=en_US.UTF-8",
        "export LANGUAGE=en_US:en",
        "export LC_ALL=en_US.UTF-8",
    ]
    task = load_task(tmp_path / "published.jsonl", swebench_images="swebench")
    assert task.environment.docker_image == "swebench/sweb.eval.x86_64.django_1776_django-12345:latest"
    assert task.image_source().image == task.environment.docker_image  # what the provider pulls
    assert task.environment.workdir == "/testbed" and task.environment.allow_internet is False


@pytest.mark.parametrize(
    ("repo", "version", "command", "parser"),
    [
        (
            "sympy/sympy",
            "1.1",
            "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose "
            "test_calc.py test_more.py",
            "sympy",
        ),
        (
            "astropy/astropy",
            "1.3",
            "pytest -rA -vv -o console_output_style=classic --tb=no test_calc.py test_more.py",
            "junit",
        ),
        ("astropy/astropy", "5.0", "pytest -rA test_calc.py test_more.py", "junit"),
        ("sphinx-doc/sphinx", "3.5", "tox --current-env -epy39 -v -- test_calc.py test_more.py", "junit"),
        ("psf/requests", "2.0", "pytest -rA test_calc.py test_more.py", "junit"),
    ],
)
def test_the_harness_test_command_per_repository(
    calc_repo: CalcRepo, tmp_path: Path, repo: str, version: str, command: str, parser: str
) -> None:
    instance = _published(calc_repo, tmp_path, "epoch", repo=repo, version=version)
    assert (instance.test_command, instance.parser) == (command, parser)
    assert instance.test_prelude == CONDA_ACTIVATE


def test_the_eval_script_runs_in_the_images_conda_environment(calc_repo: CalcRepo, tmp_path: Path) -> None:
    instance = _published(calc_repo, tmp_path, version="1.0")
    script = eval_command(instance, "/tmp/sandrl-swebench/junit.xml")
    argv = shlex.split(script)
    assert argv[:2] == ["bash", "-c"]
    assert argv[2].splitlines() == [
        "source /opt/miniconda3/bin/activate && conda activate testbed",
        "cd /testbed",
        "pytest -rA test_calc.py test_more.py --junitxml=/tmp/sandrl-swebench/junit.xml",
    ]
    # A local clone's tests run as they did: no environment to activate.
    local = replace(instance, test_prelude="")
    assert eval_command(local, "/j.xml") == "pytest -rA test_calc.py test_more.py --junitxml=/j.xml"


def test_local_clones_stay_the_default(calc_repo: CalcRepo) -> None:
    file = calc_repo.write(calc_repo.mirror.parent / "local.jsonl", calc_repo.record())
    for images in (None, "", "local"):
        tasks, problems = load_tasks(file, swebench_images=images)
        assert problems == [] and tasks[0].swebench is not None
        assert tasks[0].swebench.repo_source == calc_repo.source and tasks[0].environment.docker_image is None


async def test_grading_where_the_image_holds_the_repository(
    calc_repo: CalcRepo, tmp_path: Path, make_sandbox: SandboxFactory
) -> None:
    instance = _published(calc_repo, tmp_path, version="1.0")
    task = load_task(tmp_path / "published.jsonl", swebench_images="swebench")
    # This host has no conda: the test sandbox's Python stands in for the image's environment.
    task = replace(task, swebench=replace(instance, test_prelude="export SWEBENCH_ENV=testbed"))
    sandbox = make_sandbox(workdir=task.environment.workdir)
    with pytest.raises(TaskError, match=r"has no repository with commit .* at /testbed.*swebench_images"):
        await prepare_environment(task, sandbox)
    # What the published image has: the repository at base_commit in /testbed.
    snapshot = repository_snapshot(calc_repo.source, calc_repo.base)
    await extract_tar(sandbox, snapshot.read_bytes(), "/testbed", replace=True)
    await prepare_environment(task, sandbox)  # finds it, leaves it as it is
    result = await verify(task, sandbox, patch=calc_repo.patch)
    assert (result.reward, result.passed, result.error) == (1.0, True, None), result.stdout_tail
    result = await verify(task, sandbox, patch=calc_repo.patch.replace("a + b", "a * b"))
    assert (result.reward, result.passed) == (0.0, False)


DJANGO_LOG = """\
Testing against Django installed in '/testbed/django'
Importing application forms_tests
test_dateField (forms_tests.tests.test_input_formats.LocalizedDateTests) ... ok
test_dateField_with_inputformat (forms_tests.tests.test_input_formats.LocalizedDateTests) ... FAIL
test_timeField (forms_tests.tests.test_input_formats.LocalizedTimeTests) ... skipped 'no locale'
test_slow (forms_tests.tests.test_input_formats.SlowTests) ... Internal Server Error: /slow/
ok
test_broken (forms_tests.tests.test_input_formats.BrokenTests) ... ERROR

======================================================================
FAIL: test_dateField_with_inputformat (forms_tests.tests.test_input_formats.LocalizedDateTests)
----------------------------------------------------------------------
Ran 5 tests in 0.1s

FAILED (failures=1, errors=1, skipped=1)
"""


def test_the_django_log_parser() -> None:
    statuses = parse_django_log(DJANGO_LOG)
    base = "forms_tests.tests.test_input_formats"
    assert statuses == {
        f"test_dateField ({base}.LocalizedDateTests)": TestStatus.PASSED,
        f"test_dateField_with_inputformat ({base}.LocalizedDateTests)": TestStatus.FAILED,
        f"test_timeField ({base}.LocalizedTimeTests)": TestStatus.SKIPPED,
        f"test_slow ({base}.SlowTests)": TestStatus.PASSED,  # its "ok" on the next line
        f"test_broken ({base}.BrokenTests)": TestStatus.ERROR,
        "test_dateField_with_inputformat": TestStatus.FAILED,  # the harness also keys the FAIL: line's first word
    }


SYMPY_LOG = """\
============================= test process starts ==============================
sympy/core/tests/test_basic.py[3]
test_structure ok
test_equality F
test_matches_basic E

________________________________________________________________________________
_____________ sympy/core/tests/test_basic.py:test_equality _____________________
AssertionError
"""


def test_the_sympy_log_parser_and_grading_from_it(calc_repo: CalcRepo, tmp_path: Path) -> None:
    statuses = parse_sympy_log(SYMPY_LOG)
    assert statuses["test_structure"] is TestStatus.PASSED
    assert statuses["test_equality"] is TestStatus.FAILED
    assert statuses["test_matches_basic"] is TestStatus.ERROR
    assert statuses["sympy/core/tests/test_basic.py:test_equality"] is TestStatus.FAILED
    instance = replace(
        _published(calc_repo, tmp_path, repo="sympy/sympy", version="1.1"),
        fail_to_pass=("test_equality",),
        pass_to_pass=("test_structure", "test_absent"),
    )
    resolved, report = grade_statuses(instance, statuses.get)
    assert not resolved
    assert report["FAIL_TO_PASS"] == {"success": [], "failure": {"test_equality": "FAILED"}}
    assert report["PASS_TO_PASS"] == {"success": ["test_structure"], "failure": {"test_absent": "did not run"}}


def test_the_tasks_config_path_gives_the_images(calc_repo: CalcRepo, tmp_path: Path) -> None:
    from sandrl.train.run_config import from_dict
    from sandrl.wiring.tasks import task_set

    file = calc_repo.write(calc_repo.mirror.parent / "set.jsonl", calc_repo.record())
    config = from_dict({"tasks": {"path": str(file), "swebench_images": "epoch"}})
    (task,) = task_set(config.tasks, tmp_path / "root")
    assert task.environment.docker_image == "ghcr.io/epoch-research/swe-bench.eval.x86_64.acme__calc-1"
    (task,) = task_set(TasksConfig(path=str(file)), tmp_path / "root")  # unset: the local clone
    assert task.environment.docker_image is None and task.swebench is not None and task.swebench.repo_source
