"""The sandbox as tools: what a tool-calling policy is offered and how each call runs.

Tools (OpenAI's spec shape, rendered by the model's own chat template):

- ``bash(command, timeout_s?)``: run a shell command in the task's working directory; the
  observation is its exit code, stdout and stderr (head and tail kept, see
  :mod:`sandrl.rollout.agents.observation`); ``timeout_s`` is capped by the agent's per-command timeout.
- ``write_file(path, content)``: write a whole file (parents made); relative paths are in the
  working directory.
- ``edit_file(path, old, new)``: replace the one occurrence of ``old`` with ``new``; zero or
  several occurrences are an error the model reads.
- ``submit()``: the task is done; the calls before it in the same reply still run.

A call the model got wrong (unknown tool, a missing or mistyped argument, a file that is not
there) is answered with an error the model reads as that call's result: it is the policy's
mistake, recorded and trained on, never an infrastructure error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sandrl.errors import SandboxFileError, SandboxFileTooLargeError
from sandrl.inference.chat import ChatFormat
from sandrl.inference.toolcalls import ToolCall
from sandrl.rollout.agents.observation import render
from sandrl.sandbox.base import ExecResult, Sandbox

SUBMIT_TOOL = "submit"

EDIT_MAX_BYTES = 1 << 20
"""Largest file ``edit_file`` reads: a bigger one is refused (the model can use bash)."""


def _spec(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


SANDBOX_TOOLS: tuple[dict[str, Any], ...] = (
    _spec(
        "bash",
        "Run a shell command.",
        {"command": {"type": "string"}, "timeout_s": {"type": "number"}},
        ["command"],
    ),
    _spec(
        "write_file",
        "Write a whole file.",
        {"path": {"type": "string"}, "content": {"type": "string"}},
        ["path", "content"],
    ),
    _spec(
        "edit_file",
        "Replace the one occurrence of old in a file with new.",
        {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
        ["path", "old", "new"],
    ),
    _spec(SUBMIT_TOOL, "The task is done.", {}, []),
)
"""The tools the LLM agent offers in ``tools`` format."""


@dataclass(frozen=True)
class ToolOutcome:
    """One call's result: the text the model reads, and the command's result for a ``bash`` call."""

    text: str
    executed: ExecResult | None = None
    truncated: bool = False


async def run_tool(
    call: ToolCall,
    sandbox: Sandbox,
    *,
    chat: ChatFormat,
    workdir: str,
    timeout_s: float,
    observation_tokens: int,
) -> ToolOutcome:
    """Run one checked call (its arguments match its spec) in ``sandbox``; not ``submit``."""
    args = call.arguments
    if call.name == "bash":
        requested = args.get("timeout_s")
        timeout = (
            min(timeout_s, float(requested)) if isinstance(requested, int | float) and requested > 0 else timeout_s
        )
        executed = await sandbox.exec(str(args["command"]), timeout_s=timeout, cwd=workdir)
        shown = render(chat, executed, observation_tokens)
        return ToolOutcome(shown.text, executed, shown.truncated)
    path = str(args["path"])
    target = path if path.startswith("/") else f"{workdir.rstrip('/')}/{path}"
    if call.name == "write_file":
        data = str(args["content"]).encode()
        try:
            await sandbox.write_file(target, data)
        except SandboxFileError as exc:
            return ToolOutcome(f"error: {exc.message}")
        return ToolOutcome(f"wrote {len(data)} bytes to {target}")
    if call.name == "edit_file":
        try:
            text = (await sandbox.read_file(target, max_bytes=EDIT_MAX_BYTES)).decode("utf-8")
        except SandboxFileTooLargeError:
            return ToolOutcome(f"error: {target} is larger than {EDIT_MAX_BYTES} bytes; edit it with bash")
        except SandboxFileError as exc:
            return ToolOutcome(f"error: {exc.message}")
        except UnicodeDecodeError:
            return ToolOutcome(f"error: {target} is not UTF-8 text; edit it with bash")
        old, new = str(args["old"]), str(args["new"])
        count = text.count(old) if old else 0
        if count != 1:
            found = "old is empty" if not old else f"old occurs {count} times"
            return ToolOutcome(f"error: {found} in {target}; give text that occurs exactly once")
        try:
            await sandbox.write_file(target, text.replace(old, new, 1).encode())
        except SandboxFileError as exc:
            return ToolOutcome(f"error: {exc.message}")
        return ToolOutcome(f"edited {target}")
    raise ValueError(f"run_tool got an unchecked call to {call.name!r}")  # check_calls lets only known tools through
