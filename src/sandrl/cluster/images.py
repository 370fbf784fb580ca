"""Which image a task's sandboxes start from on a fleet: the hosts build nothing on a client's behalf.

A task whose Dockerfile only says ``FROM host`` and where to work (``WORKDIR``, which the sandbox
spec carries anyway) runs in ``host`` on any host; the generated task families are such tasks. A
task without a Dockerfile runs in its ``docker_image`` (which each host's store must hold) or
``host``. A task with a real build must have its image built on every sandbox host first: that is
refused with the command to do it.
"""

from __future__ import annotations

import re

from sandrl.errors import TaskError
from sandrl.tasks.dockerfile import _logical_lines
from sandrl.tasks.task import Task

_INSTRUCTION = re.compile(r"^\s*([A-Za-z]+)\s*(.*)$", re.DOTALL)


def trivial_host_dockerfile(text: str) -> bool:
    """Only ``FROM host`` and ``WORKDIR`` lines: the image is ``host`` itself."""
    lines = [_INSTRUCTION.match(line) for line in _logical_lines(text)]
    kinds = [(m.group(1).upper(), m.group(2).strip()) for m in lines if m is not None]
    return bool(kinds) and all(
        (kind == "FROM" and args.split()[:1] == ["host"]) or kind == "WORKDIR" for kind, args in kinds
    )


async def fleet_image(task: Task) -> str:
    """The image name ``task``'s sandboxes start from on every host of a fleet (an ``image_for``)."""
    env = task.environment
    if env.dockerfile_text is None:
        return env.docker_image or "host"
    if trivial_host_dockerfile(env.dockerfile_text):
        return "host"
    raise TaskError(
        f"task {task.id} builds its environment from a Dockerfile, and sandbox hosts build nothing for a client: "
        "build it on every host first (`sandrl tasks validate TASKS` there builds and caches each task's image) "
        "and give the task a docker_image naming it"
    )
