"""SWE-bench instances in their published images: the image of an instance, and how its tests run there.

The SWE-bench harness builds one image per instance (``swebench.harness.test_spec``): the
repository checked out at ``base_commit`` in ``/testbed`` and installed into the conda environment
``testbed`` (``source /opt/miniconda3/bin/activate && conda activate testbed``). Its name is the
harness's ``instance_image_key``::

    {namespace}/sweb.eval.{arch}.{instance_id lower-cased}:latest   with "__" replaced by "_1776_"

Published as ``swebench/...`` on Docker Hub; Epoch AI publishes smaller ones as
``ghcr.io/epoch-research/swe-bench.eval.{arch}.{instance_id}``. :func:`instance_image` gives
either, or a template of your own.

How the tests run follows the harness's ``make_eval_script_list`` (``test_spec/python.py``) with
the facts of ``constants/python.py``, for the repositories of SWE-bench, Lite and Verified:

- the same: the test command of the repository and version (``MAP_REPO_VERSION_TO_SPECS``'s
  ``test_cmd``), run in ``/testbed`` inside the ``testbed`` environment after the version's
  ``eval_commands``, on the test directives of ``test_patch`` (its files but the
  ``NON_TEST_EXTS``; for Django, module names: ``tests/`` and ``.py`` dropped, ``/`` to ``.``);
  the files ``test_patch`` touches reset to ``base_commit`` before it is applied;
- Django's and SymPy's runners are read with the harness's log parsers (``parse_log_django``,
  ``parse_log_sympy``; :mod:`sandrl.tasks.swebench_logs`); every pytest-based repository with
  pytest's JUnit XML report, which is what pytest itself recorded (the harness reads the printed
  ``-rA`` summary, which a test can print too);
- not done: the version's ``install`` command is not run again before the tests (it matters only
  for patches to compiled code), and the harness's informational ``git status`` / ``git show``.

SWE-Gym's repositories get the facts of SWE-Gym's fork of the harness (:mod:`sandrl.tasks.swe_gym`):
its images (``swegym``), test commands and ``eval_commands``.
"""

from __future__ import annotations

import re

from sandrl.tasks import swe_gym
from sandrl.tasks.task import TestParser

ARCH = "x86_64"
IMAGE_TEMPLATES = {
    "swebench": "swebench/sweb.eval.{arch}.{instance_key}:latest",
    "epoch": "ghcr.io/epoch-research/swe-bench.eval.{arch}.{instance_id}",
    "swegym": swe_gym.IMAGE_TEMPLATE,
}
"""Published image sets by name. ``{instance_key}`` is the harness's spelling: the id lower-cased,
``__`` as ``_1776_``; ``{swegym_key}`` SWE-Gym's: ``__`` as ``_s_``, lower-cased; ``{instance_id}``
the id as is; ``{arch}`` ``x86_64`` or ``arm64``."""
LOCAL = "local"
"""The ``swebench_images`` value for no image: the repository from a local clone (:mod:`sandrl.tasks.swebench`)."""
CONDA_ACTIVATE = "source /opt/miniconda3/bin/activate && conda activate testbed"
"""What every command of the harness's eval script runs in."""

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
_INSTANCE_FIELDS = ("instance_id", "instance_key", "swegym_key")
_FIELDS = (*_INSTANCE_FIELDS, "arch")

TEST_PYTEST = "pytest -rA"
TEST_DJANGO = "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1"
_DJANGO_LOCALE = ("export LANG=en_US.UTF-8", "export LC_ALL=en_US.UTF-8", "export PYTHONIOENCODING=utf8")
_TEST_COMMANDS: dict[str, str] = {
    "django/django": TEST_DJANGO,
    "sympy/sympy": "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose",
    "sphinx-doc/sphinx": "tox --current-env -epy39 -v --",
    "mwaskom/seaborn": "pytest --no-header -rA",
    "astropy/astropy": TEST_PYTEST,
}
"""The harness's ``test_cmd`` of a repository; every other one of its Python repositories: ``pytest -rA``."""
_VERSION_TEST_COMMANDS: dict[tuple[str, str], str] = {
    ("django/django", "1.9"): "./tests/runtests.py --verbosity 2",
    **{
        ("astropy/astropy", v): "pytest -rA -vv -o console_output_style=classic --tb=no"
        for v in ("0.1", "0.2", "0.3", "0.4", "1.1", "1.2", "1.3")
    },
}
_EVAL_COMMANDS: dict[tuple[str, str], tuple[str, ...]] = {
    **{
        ("django/django", v): (*_DJANGO_LOCALE, "export LANGUAGE=en_US:en")
        for v in ("1.7", "1.8", "1.9", "1.10", "1.11", "2.0", "2.1", "2.2")
    },
    **{
        ("django/django", v): (
            "sed -i '/en_US.UTF-8/s/^# //g' /etc/locale.gen && locale-gen",
            "export LANG=en_US.UTF-8",
            "export LANGUAGE=en_US:en",
            "export LC_ALL=en_US.UTF-8",
        )
        for v in ("3.0", "3.1", "3.2")
    },
}
"""The harness's ``eval_commands`` of a repository and version (only Django's have any)."""
NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")
"""The harness's ``NON_TEST_EXTS``: files of ``test_patch`` left out of the test command (``csv`` as it spells it)."""


def image_template(images: str) -> str:
    """The template of ``images``: a name of :data:`IMAGE_TEMPLATES`, or a template; ValueError if neither."""
    template = IMAGE_TEMPLATES.get(images, images)
    names = set(_PLACEHOLDER.findall(template))
    unknown = names - set(_FIELDS)
    if "{" not in template or not names & set(_INSTANCE_FIELDS) or unknown:
        raise ValueError(
            f"swebench_images must be {', '.join(repr(n) for n in IMAGE_TEMPLATES)}, {LOCAL!r}, or an image template "
            f"with {{instance_id}}, {{instance_key}} or {{swegym_key}} (and optionally {{arch}}), got {images!r}"
        )
    return template


AUTO = "auto"
"""The default: an instance's local clone when the mirror has one, else its published image
(:func:`published_images`)."""


def images_setting(value: str | None) -> str | None:
    """A ``swebench_images`` setting, checked: None for local clones only (``local``), :data:`AUTO`
    when unset or empty, else the image set or template; ValueError, saying what is valid, for
    anything else."""
    if value == LOCAL:
        return None
    if not value or value == AUTO:
        return AUTO
    image_template(value)
    return value


def instance_key(instance_id: str) -> str:
    """The harness's spelling of an instance in an image name: lower case, ``__`` as ``_1776_``."""
    return instance_id.lower().replace("__", "_1776_")


def published_images(repo: str) -> str:
    """The image set an instance of ``repo`` is published in: SWE-Gym's for its repositories, else SWE-bench's."""
    return "swegym" if swe_gym.is_swe_gym_repo(repo) else "swebench"


def instance_image(instance_id: str, images: str = "swebench", *, arch: str = ARCH) -> str:
    """The published image of an instance: ``swebench/sweb.eval.x86_64.django_1776_django-11099:latest``."""
    return image_template(images).format(
        instance_id=instance_id,
        instance_key=instance_key(instance_id),
        swegym_key=swe_gym.swegym_key(instance_id),
        arch=arch,
    )


def test_directives(repo: str, test_files: tuple[str, ...], test_patch: str = "") -> list[str]:
    """What the test command is given: the test patch's files but data files; Django's as module names;
    mypy's (SWE-Gym) ``-k`` and its test cases' names."""
    if swe_gym.is_mypy(repo):
        return swe_gym.mypy_directives(test_patch)
    directives = [name for name in test_files if not name.endswith(NON_TEST_EXTS)]
    if repo != "django/django":
        return directives
    modules = []
    for name in directives:
        name = name.removesuffix(".py")
        name = name.removeprefix("tests/")
        modules.append(name.replace("/", "."))
    return modules


def parser_for(test_command: str) -> TestParser:
    """How the output of ``test_command`` is read: the runner it starts decides."""
    if "runtests.py" in test_command:
        return "django"
    if "bin/test" in test_command:
        return "sympy"
    return "junit"


def harness_test_command(repo: str, version: str | None, test_files: tuple[str, ...], test_patch: str = "") -> str:
    """The harness's test command for an instance: its repository's ``test_cmd`` (SWE-bench's, else
    SWE-Gym's, else ``pytest -rA``) and the directives."""
    base = _VERSION_TEST_COMMANDS.get((repo, version or "")) or _TEST_COMMANDS.get(repo)
    base = base or swe_gym.test_command(repo, version) or TEST_PYTEST
    return " ".join([base, *test_directives(repo, test_files, test_patch)])


def eval_prelude(repo: str, version: str | None) -> str:
    """The lines run before the tests in the image: the conda environment, then the version's ``eval_commands``."""
    commands = _EVAL_COMMANDS.get((repo, version or ""), swe_gym.EVAL_COMMANDS.get(repo.lower(), ()))
    return "\n".join([CONDA_ACTIVATE, *commands])
