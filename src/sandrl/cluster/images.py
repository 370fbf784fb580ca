"""Which image a task's sandboxes start from on a fleet: the hosts build nothing on a client's behalf.

A task whose Dockerfile only says ``FROM host`` and where to work (``WORKDIR``, which the sandbox
spec carries anyway) runs in ``host`` on any host; the generated task families are such tasks. A
task without a Dockerfile runs in its ``docker_image`` (which each host's store must hold) or
``host``. A task with a real build must have its image built on every sandbox host first: that is
refused with the command to do it.
"""

from __future__ import annotations

from sandrl.errors import ImageBuildError, TaskError
from sandrl.images.dockerfile import only_workdir_over, parse_dockerfile
from sandrl.tasks.task import Task


def trivial_host_dockerfile(text: str) -> bool:
    """Only ``FROM host`` and ``WORKDIR`` lines: the image is ``host`` itself (not so for a
    Dockerfile that cannot be read: it is refused as a real build is)."""
    try:
        return only_workdir_over(parse_dockerfile(text), "host")
    except ImageBuildError:
        return False


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
