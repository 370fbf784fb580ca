"""Which E2B template a task's image is: fixed by what the image is made of."""

from __future__ import annotations

import shutil
from pathlib import Path

from sandrl.sandbox.base import ImageSource
from sandrl.sandbox.e2b.templates import BASE_TEMPLATE, template_for
from sandrl.tasks.builtin import SUITE_DIR
from sandrl.tasks.builtin.generated import generate_tasks
from sandrl.tasks.loader import load_tasks


def _source(task_dir: Path) -> ImageSource:
    (task,), problems = load_tasks(task_dir)
    assert problems == []
    return task.image_source()


def test_host_only_images_are_the_base_template(tmp_path: Path) -> None:
    generate_tasks(tmp_path, "echo", 1, 0)
    assert template_for(_source(next(tmp_path.iterdir()))) == BASE_TEMPLATE
    assert template_for(ImageSource("no image")) == BASE_TEMPLATE
    assert template_for(ImageSource("named", image="host")) == BASE_TEMPLATE
    assert template_for(ImageSource("named", image="myimage")) == "myimage"
    assert template_for(ImageSource("pulled", image="ubuntu:24.04")).startswith("ubuntu")


def test_a_built_image_is_named_by_its_dockerfile_and_context(tmp_path: Path) -> None:
    task = tmp_path / "task"
    shutil.copytree(SUITE_DIR / "fix-lru-cache-eviction", task)
    name = template_for(_source(task))
    assert name.startswith("sandrl-") and name == template_for(_source(task))
    context_file = next(p for p in (task / "environment").rglob("*") if p.is_file() and p.name != "Dockerfile")
    context_file.write_text(context_file.read_text() + "\n# changed\n")
    changed = template_for(_source(task))
    assert changed.startswith("sandrl-") and changed != name


def test_a_dockerfile_with_heredocs_is_a_template_an_e2b_build_makes() -> None:
    # E2B builds templates with Docker, which runs heredocs: only sandrl's own builder refuses them.
    source = ImageSource("heredoc", dockerfile_text="FROM host\nRUN <<EOF\necho hi > /x\nEOF\nWORKDIR /w\n")
    assert template_for(source).startswith("sandrl-")
    assert template_for(ImageSource("only", dockerfile_text="FROM host\nWORKDIR /w\n")) == BASE_TEMPLATE
