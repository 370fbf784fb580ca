"""A CLI agent's episode: the CLI started inside the sandbox, its API the episode's gateway session.

Run by :class:`~sandrl.rollout.agents.harness.HarnessAgent` as any harness is (its session, budget and
trajectory are the harness's); what differs is where the agent lives:

1. **The way out.** The gateway listens on the host's loopback, which a sandbox never reaches. The
   sandbox gets one port forwarded into its own network namespace (``127.0.0.1:<port>`` inside
   relayed to the gateway, :func:`~sandrl.sandbox.base.forward_port`), and the CLI's base URL is
   that address plus the session's path: the session's routes, behind the session's key, and
   nothing else of the host. The session is bound to the sandbox (``session.sandbox``): the
   gateway serves it only through this sandbox's forward, and this sandbox no other session
   (:mod:`sandrl.inference.auth`).
2. **The run.** The CLI's files (its config, the instruction) are written into the sandbox, and the
   CLI is started in the task's working directory in its non-interactive mode (:mod:`.claude_code`,
   :mod:`.codex`), its output and error output written to files in the sandbox.
3. **The end.** The CLI ends by itself (it thinks the task is done), or the gateway refuses a call
   for the budget (turns or tokens: ``session.stopped``) or because the policy failed
   (``session.failure``), after which the CLI has ``stop_grace_s`` to exit before it is killed; or
   the agent's wall time runs out, a moment before which the CLI is killed (its command's timeout),
   so that its logs can still be read.
4. **The logs.** The last ``log_bytes`` of each of its two outputs are kept with the episode
   (:attr:`~sandrl.rollout.trajectory.Trajectory.agent_logs`): what a sandbox wrote is hostile, so
   only a bounded tail, decoded with replacement.

A CLI that exits with an error while the session has not stopped is the agent's failure (the
episode's ``error``, with the end of its error output); a refused forward or a sandbox that fails
under it is the infra error it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from urllib.parse import urlsplit

from sandrl.errors import SandboxError
from sandrl.rollout.agents.cli.config import CliAgentsConfig
from sandrl.rollout.agents.cli.install import CliInstall
from sandrl.rollout.agents.cli.spec import STDERR_LOG, STDOUT_LOG, WORK_DIR, LaunchInputs
from sandrl.rollout.agents.harness import HarnessContext
from sandrl.rollout.trajectory import StopReason
from sandrl.sandbox.base import ExecResult, ForwardedPort, Sandbox, forward_port

FORWARD_PORTS = (41960, 41961, 41962, 41963)
"""Ports tried in the sandbox for the gateway, in turn, should the task already listen on one."""
WALL_MARGIN_S = 3.0
"""The CLI is killed this long before the agent's wall time, so that its logs can still be read."""
STOPPED_POLL_S = 0.2
_ERROR_TAIL = 2000


class CliHarness:
    """One CLI agent's harness (see the module): ``run`` is what :class:`HarnessAgent` calls per episode."""

    def __init__(self, install: CliInstall, config: CliAgentsConfig) -> None:
        self.install = install
        self.config = config

    async def run(self, ctx: HarnessContext) -> StopReason:
        gateway = urlsplit(ctx.base_url)
        if gateway.hostname is None or gateway.port is None:
            raise SandboxError(f"the session's base URL {ctx.base_url!r} names no host and port to forward")
        forward = await _forward(ctx.sandbox, (gateway.hostname, gateway.port))
        ctx.session.sandbox = forward.tag  # the session answers to this sandbox only, and it to no other
        # The run's sampling, not the CLI's: Codex sends no max_output_tokens, neither sends a temperature.
        ctx.session.max_new_tokens = ctx.max_new_tokens
        ctx.session.temperature = ctx.temperature
        try:
            inputs = LaunchInputs(
                instruction=ctx.task.instruction,
                base_url=f"http://127.0.0.1:{forward.port}{gateway.path}",
                api_key=ctx.api_key,
                model=ctx.model,
                max_new_tokens=ctx.max_new_tokens,
                temperature=ctx.temperature,
                max_turns=ctx.budget.max_turns,
                command_timeout_s=ctx.command_timeout_s,
                install_dir=self.install.install_dir,
            )
            launch = self.install.spec.launch(inputs)
            await _write(ctx.sandbox, launch.files)
            command = (
                f"exec {shlex.join(launch.argv)} < {shlex.quote(launch.stdin_file)} > {STDOUT_LOG} 2> {STDERR_LOG}"
            )
            try:
                result = await self._until_done(ctx, command, dict(launch.env))
            finally:
                ctx.logs.update(await self._logs(ctx.sandbox))
        finally:
            with contextlib.suppress(Exception):
                await forward.close()
        if result is None:
            return "done"  # the session stopped it: the agent's result says which budget (the session's)
        if result.timed_out:
            return "wall_time"
        if result.exit_code != 0 and ctx.session.stopped is None and ctx.session.failure is None:
            said = ctx.logs.get("stderr", "").strip() or ctx.logs.get("stdout", "").strip()
            raise RuntimeError(f"{self.install.label} exited {result.exit_code}: {said[-_ERROR_TAIL:]}")
        return "done"

    async def _until_done(self, ctx: HarnessContext, command: str, env: dict[str, str]) -> ExecResult | None:
        """The CLI's result once it ends by itself; None when it was ended because the session stopped."""
        timeout = max(ctx.deadline.remaining() - WALL_MARGIN_S, 1.0)
        running = asyncio.ensure_future(
            ctx.sandbox.exec(command, timeout_s=timeout, cwd=ctx.task.environment.workdir, env=env)
        )
        try:
            while not running.done():
                await asyncio.wait([running], timeout=STOPPED_POLL_S)
                if running.done() or (ctx.session.stopped is None and ctx.session.failure is None):
                    continue
                await asyncio.wait([running], timeout=self.config.stop_grace_s)  # it may end cleanly on the refusal
                if not running.done():
                    running.cancel()  # the sandbox kills the command (and all it started)
                    with contextlib.suppress(asyncio.CancelledError):
                        await running
                    return None
            return running.result()
        finally:
            if not running.done():
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError, SandboxError):
                    await running

    async def _logs(self, sandbox: Sandbox) -> dict[str, str]:
        """The end of each of the CLI's outputs, at most ``log_bytes`` each, decoded with replacement."""
        keep = self.config.log_bytes
        if keep == 0:
            return {}
        logs: dict[str, str] = {}
        for name, path in (("stdout", STDOUT_LOG), ("stderr", STDERR_LOG)):
            with contextlib.suppress(SandboxError):
                tail = await sandbox.exec(["tail", "-c", str(keep), "--", path], timeout_s=10.0)  # stderr unread
                logs[name] = tail.stdout[-keep:]
        return logs


async def _forward(sandbox: Sandbox, target: tuple[str, int]) -> ForwardedPort:
    """The gateway forwarded into ``sandbox`` on the first of :data:`FORWARD_PORTS` the task leaves free."""
    for port in FORWARD_PORTS[:-1]:
        try:
            return await forward_port(sandbox, port, target)
        except SandboxError as exc:
            if "in use" not in str(exc).lower() and "eaddrinuse" not in str(exc).lower():
                raise
    return await forward_port(sandbox, FORWARD_PORTS[-1], target)


async def _write(sandbox: Sandbox, files: dict[str, bytes] | object) -> None:
    assert isinstance(files, dict)
    dirs = sorted({path.rsplit("/", 1)[0] for path in files} | {WORK_DIR})
    made = await sandbox.exec(["mkdir", "-p", "--", *dirs], timeout_s=30.0)
    if made.exit_code != 0:
        raise SandboxError(f"cannot make the agent's directories in the sandbox: {made.stderr.strip()[-300:]}")
    for path, data in files.items():
        await sandbox.write_file(path, data, 0o600)
