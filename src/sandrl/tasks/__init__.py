"""What an episode attempts: the task model, the loaders of Harbor, Terminal-Bench 1 and SWE-bench
tasks, and the task's side of an episode (environment setup, oracle, verifier) over the Sandbox
protocol.

::

    tasks, problems = load_tasks(Path("tasks/"))
    task = tasks[0]
    image = await provider.resolve_image(task.image_source())  # its Dockerfile, built or cached
    async with await provider.create(task.to_sandbox_spec(image=image)) as sandbox:
        await prepare_environment(task, sandbox)
        ...                                    # the agent works
        result = await verify(task, sandbox)   # result.reward, result.passed
"""

from sandrl.tasks.fields import TaskWarning
from sandrl.tasks.harbor import load_harbor_task
from sandrl.tasks.loader import TaskProblem, detect_format, load_task, load_tasks
from sandrl.tasks.pytest_results import TestStatus
from sandrl.tasks.result import VerifyResult
from sandrl.tasks.swebench import load_swebench_instances
from sandrl.tasks.task import (
    EnvironmentSpec,
    RewardSource,
    SolutionSpec,
    SweBenchInstance,
    Task,
    TaskFormat,
    VerifierSpec,
)
from sandrl.tasks.terminal_bench import load_terminal_bench_task
from sandrl.tasks.verify import prepare_environment, run_solution, verify

__all__ = [
    "EnvironmentSpec",
    "RewardSource",
    "SolutionSpec",
    "SweBenchInstance",
    "Task",
    "TaskFormat",
    "TaskProblem",
    "TaskWarning",
    "TestStatus",
    "VerifierSpec",
    "VerifyResult",
    "detect_format",
    "load_harbor_task",
    "load_swebench_instances",
    "load_task",
    "load_tasks",
    "load_terminal_bench_task",
    "prepare_environment",
    "run_solution",
    "verify",
]
