"""A short RL-style loop through the e2b SDK, written the way slime's ``E2BSandbox`` uses it.

A framework that talks to sandboxes through the SDK (exec, write_file, read_file, close)
switches to sandrl by its environment alone: nothing below names sandrl.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import TracebackType

from e2b import AsyncSandbox, CommandExitException

from .conftest import E2BServer


@dataclass
class ExecOutput:
    exit_code: int
    stdout: str
    stderr: str


class E2BSandbox:
    """The shape of slime's sandbox protocol (exec, write_file, read_file, async context manager) over the SDK."""

    def __init__(self, template: str = "base", timeout_s: int = 120) -> None:
        self.template = template
        self.timeout_s = timeout_s
        self._sb: AsyncSandbox | None = None

    async def __aenter__(self) -> E2BSandbox:
        self._sb = await AsyncSandbox.create(self.template, timeout=self.timeout_s)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._sb is not None:
            await self._sb.kill()

    @property
    def sb(self) -> AsyncSandbox:
        assert self._sb is not None, "use the sandbox inside `async with`"
        return self._sb

    async def exec(self, command: str, timeout: float = 60, cwd: str | None = None) -> ExecOutput:
        try:
            result = await self.sb.commands.run(command, timeout=timeout, cwd=cwd)
        except CommandExitException as exc:
            return ExecOutput(exc.exit_code, exc.stdout, exc.stderr)
        return ExecOutput(result.exit_code, result.stdout, result.stderr)

    async def write_file(self, path: str, content: str | bytes) -> None:
        await self.sb.files.write(path, content)

    async def read_file(self, path: str) -> str:
        return await self.sb.files.read(path)


TASK = "def add(a, b):\n    return a + b\n"
TESTS = "from solution import add\nassert add(2, 3) == 5\nprint('PASS')\n"
ATTEMPTS = ["def add(a, b):\n    return a - b\n", TASK]  # what a policy might answer, wrong then right


async def _episode(answer: str) -> float:
    async with E2BSandbox() as sandbox:
        await sandbox.exec("mkdir -p /workspace/task")
        await sandbox.write_file("/workspace/task/solution.py", answer)  # the agent's action
        observed = await sandbox.exec("cat solution.py", cwd="/workspace/task")
        assert observed.stdout == answer
        await sandbox.write_file("/workspace/task/test_solution.py", TESTS)  # tests only at verify time
        verdict = await sandbox.exec("python3 test_solution.py > result.txt 2>&1", cwd="/workspace/task", timeout=30)
        report = await sandbox.read_file("/workspace/task/result.txt")
        return 1.0 if verdict.exit_code == 0 and "PASS" in report else 0.0


async def test_grpo_style_group_of_episodes(e2b_server: E2BServer) -> None:
    live = set(e2b_server.service.entries)
    rewards = await asyncio.gather(*(_episode(answer) for answer in ATTEMPTS * 2))
    assert rewards == [0.0, 1.0, 0.0, 1.0]
    assert set(e2b_server.service.entries) == live  # every episode's sandbox is gone
