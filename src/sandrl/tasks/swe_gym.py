"""SWE-Gym (``SWE-Gym/SWE-Gym`` on Hugging Face): SWE-bench's rows for 11 other Python repositories.

Its rows have SWE-bench's shape (``FAIL_TO_PASS`` and ``PASS_TO_PASS`` as real lists, no
``environment_setup_commit``) and load as SWE-bench instances (:mod:`sandrl.tasks.swebench`); what
differs are the facts of SWE-Gym's fork of the harness (``SWE-Gym/SWE-Bench-Fork``,
``swebench/harness/constants.py`` and ``test_spec.py``), kept here:

- the images, one per instance, built by that fork and published by its authors as
  ``xingyaoww/sweb.eval.x86_64.<id>`` with ``__`` spelled ``_s_``, lower-cased (OpenHands'
  ``get_instance_docker_image``): the repository at ``/testbed``, the conda environment ``testbed``;
- each repository's test command, and Conan's ``eval_commands``;
- ``python/mypy``: its tests are cases of data files, picked by name with ``-k`` from the
  ``[case ...]`` headers of ``test_patch`` rather than by test file.
"""

from __future__ import annotations

import re
import shlex

IMAGE_TEMPLATE = "xingyaoww/sweb.eval.{arch}.{swegym_key}:latest"


def swegym_key(instance_id: str) -> str:
    """An instance's spelling in SWE-Gym's image names: ``__`` as ``_s_``, lower case."""
    return instance_id.replace("__", "_s_").lower()


_MYPY = "python/mypy"
_MYPY_NO_XDIST_FLAG = ("1.7", "1.8", "1.9", "1.10", "1.11")
"""mypy versions whose fork command has no ``-n0``."""
TEST_COMMANDS: dict[str, str] = {
    "getmoto/moto": "pytest -n0 -rA",
    "conan-io/conan": "pytest -n0 -rA",
    "dask/dask": "pytest -n0 -rA --color=no",
    "project-monai/monai": "pytest -rA",
    "iterative/dvc": "pytest -rA",
    "bokeh/bokeh": "pytest -rA -n0",
    "modin-project/modin": "pytest -n0 -rA",
    "pydantic/pydantic": "pytest -rA --tb=short -vv -o console_output_style=classic --no-header",
    "pandas-dev/pandas": "pytest -rA --tb=long",
    "facebookresearch/hydra": "pytest -rA --tb=long",
    _MYPY: "pytest -n0 -rA",
}
"""The fork's ``test_cmd`` per repository (lower-cased, as the fork keys them), for every version."""
EVAL_COMMANDS: dict[str, tuple[str, ...]] = {
    "conan-io/conan": ("export PYTHONPATH=${PYTHONPATH:-}:$(pwd)",),
}
"""The fork's ``eval_commands``, run before the tests (Conan's, for every version)."""

_MYPY_CASE = re.compile(r"\[case ([^\]]+)\]")


def is_swe_gym_repo(repo: str) -> bool:
    return repo.lower() in TEST_COMMANDS


def test_command(repo: str, version: str | None) -> str | None:
    """The fork's test command of ``repo`` at ``version`` (without its directives); None if not SWE-Gym's."""
    key = repo.lower()
    if key == _MYPY and version in _MYPY_NO_XDIST_FLAG:
        return "pytest -rA"
    return TEST_COMMANDS.get(key)


def mypy_directives(test_patch: str) -> list[str]:
    """mypy's tests: ``-k`` and the test patch's case names joined with ``or`` (the fork's ``make_test_command``)."""
    cases = _MYPY_CASE.findall(test_patch)
    return ["-k", shlex.quote(" or ".join(cases))] if cases else []


def is_mypy(repo: str) -> bool:
    return repo.lower() == _MYPY
