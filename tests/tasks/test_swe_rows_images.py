"""SWE-Gym, SWE-smith and R2E-Gym rows run for real: each in its published image (made here, on this
host, under the name its row gives, so the provider finds it in its store and pulls nothing), set up,
solved by the oracle (reward 1) or left alone (reward 0), graded as each harness grades.

The images are what the datasets' images are, small: the repository at ``/testbed`` (SWE-smith's a
clone of its mirror, with an instance branch), R2E-Gym's tests in ``/r2e_tests`` and its
``run_tests.sh``, and a conda ``activate`` under which this host's Python (with pytest) is the
environment ``testbed``.
"""

from __future__ import annotations

import asyncio
import io
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandrl.images.reference import parse_reference, store_name
from sandrl.sandbox.base import Sandbox
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.dockerfile.builder import ImageBuilder
from sandrl.tasks import Task, load_tasks, prepare_environment, run_solution, verify
from sandrl.tasks.swebench_eval import repository_snapshot
from sandrl.wiring.suite import run_suite

from ..support import REASON as SANDBOX_REASON
from .conftest import make_calc_repo
from .swe_rows import (
    CONDA,
    R2E_RUN_TESTS,
    R2E_TESTS,
    SMITH_BRANCH_ID,
    SMITH_FALLBACK_ID,
    SMITH_IMAGE,
    SWE_GYM_IMAGE,
    r2e_commit,
    r2e_row,
    smith_mirror,
    smith_testbed,
    swe_gym_row,
    swe_smith_row,
    write_rows,
)

REASON = SANDBOX_REASON or (None if shutil.which("nsenter") else "nsenter (util-linux) is not installed")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

SMITH_AT_BASE_ID = "acme__calc.0123abcd.func_pm_op_swap__cccc3333"
"""An instance whose base_commit the image has (another instance's branch, here)."""

DOCKERFILE = "FROM host\nCOPY . /\nWORKDIR /testbed\n"


@dataclass
class Published:
    rows: Path
    """A directory of row files: SWE-Gym's, SWE-smith's and R2E-Gym's."""
    branch_sha: str
    r2e_image: str


def _build(provider: BwrapProvider, context: Path, reference: str) -> None:
    """The image ``reference`` names, built from ``context`` under the store name a pull would give it."""
    (context / "opt" / "miniconda3" / "bin").mkdir(parents=True, exist_ok=True)
    (context / "opt" / "miniconda3" / "bin" / "activate").write_text(CONDA)
    (context / "Dockerfile").write_text(DOCKERFILE)
    tag = store_name(parse_reference(reference))
    asyncio.run(ImageBuilder(provider).build(context=context, text=DOCKERFILE, tag=tag))


def _untar(data: bytes, dest: Path) -> None:
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        archive.extractall(dest, filter="tar")


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BwrapProvider]:
    p = BwrapProvider(tmp_path_factory.mktemp("swe-rows-state"))
    yield p
    p._close_all_sync()


@pytest.fixture(scope="module")
def published(provider: BwrapProvider, tmp_path_factory: pytest.TempPathFactory) -> Published:
    root = tmp_path_factory.mktemp("swe-rows")
    calc = make_calc_repo(root / "calc")
    at_base = repository_snapshot(calc.source, calc.base).read_bytes()  # the repository and nothing after base

    gym = root / "gym-image"
    _untar(at_base, gym / "testbed")
    _build(provider, gym, SWE_GYM_IMAGE)

    mirror = smith_mirror(root / "smith")
    smith = root / "smith-image"
    smith.mkdir()
    smith_testbed(mirror, smith / "testbed")
    _build(provider, smith, SMITH_IMAGE)

    commit = r2e_commit(calc, root)
    r2e = root / "r2e-image"
    _untar(at_base, r2e / "testbed")
    (r2e / "testbed" / "run_tests.sh").write_text(R2E_RUN_TESTS)
    (r2e / "r2e_tests").mkdir()
    (r2e / "r2e_tests" / "test_1.py").write_text(R2E_TESTS)
    row = r2e_row(commit)
    _build(provider, r2e, str(row["docker_image"]))

    rows = root / "rows"
    write_rows(rows / "swe-gym.jsonl", [swe_gym_row(calc)])
    write_rows(
        rows / "swe-smith.jsonl",
        [
            swe_smith_row(mirror),
            swe_smith_row(mirror, SMITH_BRANCH_ID, base_commit=None),
            swe_smith_row(mirror, SMITH_AT_BASE_ID, base_commit=mirror.branch_sha),
        ],
    )
    write_rows(rows / "r2e-gym.jsonl", [row])
    return Published(rows, mirror.branch_sha, str(row["docker_image"]))


def _tasks(published: Published) -> dict[str, Task]:
    tasks, problems = load_tasks(published.rows)
    assert problems == []
    return {task.id: task for task in tasks}


async def test_every_format_runs_in_its_published_image_and_its_oracle_scores_1(
    provider: BwrapProvider, published: Published
) -> None:
    tasks = list(_tasks(published).values())
    assert sorted(task.format for task in tasks) == ["r2e-gym", "swe-bench", "swe-smith", "swe-smith", "swe-smith"]
    oracle = await run_suite(tasks, "oracle", provider, concurrency=5)
    for run in oracle:
        assert (run.error, run.reward, run.status) == (None, 1.0, "completed"), run
        assert run.image is not None and run.image != "host"
    null = await run_suite(tasks, "null", provider, concurrency=5)
    for run in null:
        assert (run.reward, run.status) == (0.0, "completed"), run  # unsolved, which is the agent's: not infra


async def _sandbox(provider: BwrapProvider, task: Task) -> Sandbox:
    image = await provider.resolve_image(task.image_source())
    sandbox = await provider.create(task.to_sandbox_spec(image=image))
    await prepare_environment(task, sandbox)
    return sandbox


async def _sh(sandbox: Sandbox, command: str) -> str:
    done = await sandbox.exec(command, cwd="/testbed", timeout_s=60.0)
    assert done.exit_code == 0, done
    return done.stdout.strip()


async def test_swe_smith_grades_against_the_bug_commit_made_at_setup_whatever_the_agent_moves(
    provider: BwrapProvider, published: Published
) -> None:
    tasks = _tasks(published)
    async with await _sandbox(provider, tasks[SMITH_BRANCH_ID]) as sandbox:
        assert await _sh(sandbox, "git rev-parse HEAD") == published.branch_sha  # the image's branch, checked out
    async with await _sandbox(provider, tasks[SMITH_AT_BASE_ID]) as sandbox:
        assert await _sh(sandbox, "git rev-parse HEAD") == published.branch_sha  # its base_commit
    task = tasks[SMITH_FALLBACK_ID]
    async with await _sandbox(provider, task) as sandbox:
        # No branch of its own in the image: the bug applied on the image's HEAD, committed.
        made = await _sh(sandbox, "git rev-parse HEAD")
        assert made != published.branch_sha and await _sh(sandbox, "git log --format=%s -1") == (
            f"Bug Patch: {SMITH_FALLBACK_ID}"
        )
        assert "return a - b" in await _sh(sandbox, "cat calc.py")
        # The agent fixes it, commits, and leaves the repository on another branch with its own refs.
        assert (await run_solution(task, sandbox)).exit_code == 0
        await _sh(
            sandbox,
            "git -c user.name=a -c user.email=a@a commit -qam fix && git checkout -q -b elsewhere && "
            "git branch -f main HEAD && git update-ref refs/remotes/origin/main HEAD",
        )
        assert (await verify(task, sandbox)).reward == 1.0
    async with await _sandbox(provider, task) as sandbox:
        assert await _sh(sandbox, "git rev-parse HEAD") == made  # the same commit in every sandbox of the image
        # Tests made to pass instead of the bug fixed: the test files are the bug commit's when graded.
        await _sh(sandbox, "sed -i 's/assert /assert True or /' test_calc.py test_more.py")
        result = await verify(task, sandbox)
        assert result.reward == 0.0 and result.error is None
        assert "test_calc.py::test_add" in result.details["FAIL_TO_PASS"]["failure"]


async def test_r2e_gyms_tests_are_out_of_the_agents_reach(provider: BwrapProvider, published: Published) -> None:
    (task,) = [task for task in _tasks(published).values() if task.format == "r2e-gym"]
    async with await _sandbox(provider, task) as sandbox:
        gone = await sandbox.exec("ls /r2e_tests /testbed/run_tests.sh", timeout_s=30.0)
        assert gone.exit_code != 0  # taken out before the agent starts
        # Tests of the agent's own at the path run_tests.sh reads: replaced by the real ones at verify time.
        await _sh(sandbox, "mkdir -p r2e_tests && printf 'def test_add():\\n    pass\\n' > r2e_tests/test_1.py")
        result = await verify(task, sandbox)
        assert result.reward == 0.0 and result.error is None and not result.infra_error
        assert result.details["wrong_status"] == {
            "test_add": {"expected": "PASSED", "got": "FAILED"},
            "TestAdd.test_commutes": {"expected": "PASSED", "got": "FAILED"},
        }
        assert (await run_solution(task, sandbox)).exit_code == 0
        solved = await verify(task, sandbox)
        assert solved.reward == 1.0, solved
        assert solved.details["reported_tests"] == 4  # the expected FAILED one included
