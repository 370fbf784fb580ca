"""How the policy acts, per reply: a fenced ``bash`` block, or tool calls in its family's format.

An :class:`ActionFormat` turns one model reply into what the sandbox runs and into the messages
the chat template renders after the reply (:class:`Step`). Two formats:

- ``fenced`` (:class:`FencedFormat`): the first ```bash block of the reply is the command;
  ``submit`` alone in a block finishes; the observation is one message of the agent's
  observation role. No tools are given to the template.
- ``tools`` (:class:`ToolFormat`): the sandbox is offered as tools (:mod:`sandrl.rollout.agents.tools`)
  through the template's ``tools=``; the reply's calls are parsed by the model family's parser
  (:mod:`sandrl.inference.toolcalls`, chosen by name or detected from the template) and each
  result goes back as a ``tool`` message answering its call.

A reply the format cannot use (no block, no call, bad JSON, an unknown tool, a missing argument)
is a format error the model reads as the observation; the episode goes on and the trajectory
counts it, as any other policy output.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from sandrl.errors import ConfigError, SandboxCrashedError
from sandrl.inference.chat import ChatFormat, tool_parser_for
from sandrl.inference.tokenizer import Message, Tokenizer
from sandrl.inference.toolcalls import ToolCallParser, check_calls
from sandrl.rollout.agent import Deadline
from sandrl.rollout.agents.fenced import SUBMIT, parse_action
from sandrl.rollout.agents.observation import FORMAT_ERROR, render
from sandrl.rollout.agents.tools import SANDBOX_TOOLS, SUBMIT_TOOL, run_tool
from sandrl.sandbox.base import Sandbox
from sandrl.tasks.task import Task

AgentFormat = Literal["fenced", "tools"]
FORMATS: tuple[AgentFormat, ...] = ("fenced", "tools")

FENCED_SYSTEM_PROMPT = f"""You are an agent working in a Linux shell to solve a task.
Each reply runs one shell command. Put it in a fenced bash block:

```bash
ls -la
```

The command runs as root in the task's working directory; you then see its exit code, stdout and stderr.
Files persist between commands. Long output is cut in the middle.
When the task is done, reply with a block holding only the word {SUBMIT}:

```bash
{SUBMIT}
```"""
"""What the model is told about its one tool and the finish convention (``fenced`` format)."""

TOOLS_SYSTEM_PROMPT = """You are an agent working in a Linux shell to solve a task.
Act by calling the tools. Commands run as root in the task's working directory and files persist.
Long output is cut in the middle. When the task is done, call submit."""
"""The system prompt of the ``tools`` format; the chat template adds the tools themselves."""

TOOLS_FORMAT_ERROR = "No valid tool call found. Call one of the tools (bash, write_file, edit_file, submit)."


@dataclass(frozen=True)
class StepLimits:
    """What one step may spend: the per-command timeout and the observation's token budget."""

    command_timeout_s: float
    observation_tokens: int


@dataclass
class Step:
    """What one reply did: the messages after it, and what the turn records."""

    assistant: Message
    appended: list[Message] = field(default_factory=list)
    submitted: bool = False
    out_of_time: bool = False
    """A command was due but the agent's wall time was up (it did not run)."""
    crashed: SandboxCrashedError | None = None
    """The policy's command brought the sandbox down (the turn is kept, trained as a failure)."""
    commands: list[str] = field(default_factory=list)
    exit_code: int | None = None
    timed_out: bool = False
    truncated: bool = False
    command_s: float = 0.0
    sandbox_wait_s: float = 0.0
    tool_calls: list[dict[str, Any]] | None = None

    @property
    def command(self) -> str | None:
        return "\n".join(self.commands) if self.commands else None


class ActionFormat(Protocol):
    name: AgentFormat
    system_prompt: str
    tools: list[dict[str, Any]] | None

    async def step(
        self, reply: str, task: Task, sandbox: Sandbox, deadline: Deadline, chat: ChatFormat, limits: StepLimits
    ) -> Step: ...

    def demonstration(self, command: str) -> Message:
        """The assistant message that runs ``command`` in this format (what a warm start teaches)."""
        ...


class FencedFormat:
    """The first ```bash block is the command; see the module docstring."""

    name: AgentFormat = "fenced"
    tools: list[dict[str, Any]] | None = None

    def __init__(self, observation_role: str = "tool", system_prompt: str | None = None) -> None:
        self.observation_role = observation_role
        self.system_prompt = system_prompt or FENCED_SYSTEM_PROMPT

    def demonstration(self, command: str) -> Message:
        return {"role": "assistant", "content": f"```bash\n{command}\n```"}

    async def step(
        self, reply: str, task: Task, sandbox: Sandbox, deadline: Deadline, chat: ChatFormat, limits: StepLimits
    ) -> Step:
        step = Step(assistant={"role": "assistant", "content": reply})
        action = parse_action(reply)
        if action.kind == "submit":
            step.submitted = True
            return step
        observation = FORMAT_ERROR
        if action.command is not None:
            step.commands.append(action.command)
            timeout = min(limits.command_timeout_s, deadline.remaining())
            if timeout <= 0:
                step.out_of_time = True
                return step
            waited = time.monotonic()
            try:
                executed = await sandbox.exec(action.command, timeout_s=timeout, cwd=task.environment.workdir)
            except SandboxCrashedError as exc:
                if not exc.caused_by_sandbox:
                    raise
                step.crashed = exc
                return step
            shown = render(chat, executed, limits.observation_tokens)
            observation = shown.text
            step.exit_code, step.timed_out, step.truncated = executed.exit_code, executed.timed_out, shown.truncated
            step.command_s, step.sandbox_wait_s = executed.duration_s, time.monotonic() - waited
        step.appended.append({"role": self.observation_role, "content": observation})
        return step


class ToolFormat:
    """Tool calls in the model family's format; see the module docstring."""

    name: AgentFormat = "tools"

    def __init__(
        self, parser: ToolCallParser, system_prompt: str | None = None, tools: Sequence[str] | None = None
    ) -> None:
        self.parser = parser
        self.system_prompt = system_prompt or TOOLS_SYSTEM_PROMPT
        self.tools: list[dict[str, Any]] | None = select_tools(tools)

    def demonstration(self, command: str) -> Message:
        call = {"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": {"command": command}}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}

    async def step(
        self, reply: str, task: Task, sandbox: Sandbox, deadline: Deadline, chat: ChatFormat, limits: StepLimits
    ) -> Step:
        parsed = self.parser.parse(reply, tools=self.tools or ())
        calls = list(parsed.tool_calls)
        assistant: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if calls:
            assistant["tool_calls"] = [c.for_template() for c in calls]
        step = Step(assistant=assistant, tool_calls=[])
        assert step.tool_calls is not None
        for call in calls:
            problems = check_calls([call], self.tools or ())
            if problems:
                step.tool_calls.append({"name": call.name, "arguments": call.arguments, "error": "; ".join(problems)})
                step.appended.append(_tool_message(call.id, call.name, "error: " + " ".join(problems)))
                continue
            step.tool_calls.append({"name": call.name, "arguments": call.arguments})
            if call.name == SUBMIT_TOOL:
                step.submitted = True
                return step
            timeout = min(limits.command_timeout_s, deadline.remaining())
            if timeout <= 0:
                step.out_of_time = True
                return step
            if call.name == "bash":
                step.commands.append(str(call.arguments["command"]))
            waited = time.monotonic()
            try:
                outcome = await run_tool(
                    call,
                    sandbox,
                    chat=chat,
                    workdir=task.environment.workdir,
                    timeout_s=timeout,
                    observation_tokens=limits.observation_tokens,
                )
            except SandboxCrashedError as exc:
                if not exc.caused_by_sandbox:
                    raise
                step.crashed = exc
                return step
            step.sandbox_wait_s += time.monotonic() - waited
            if outcome.executed is not None:
                step.exit_code = outcome.executed.exit_code
                step.timed_out = step.timed_out or outcome.executed.timed_out
                step.command_s += outcome.executed.duration_s
            step.truncated = step.truncated or outcome.truncated
            step.appended.append(_tool_message(call.id, call.name, outcome.text))
        if parsed.errors or not calls:
            step.tool_calls.extend({"error": e} for e in parsed.errors)
            step.appended.append({"role": "user", "content": "\n".join([*parsed.errors, TOOLS_FORMAT_ERROR])})
        return step


def select_tools(names: Sequence[str] | None) -> list[dict[str, Any]]:
    """The specs of the sandbox tools named (all of them for None), in their listed order."""
    known = {t["function"]["name"]: t for t in SANDBOX_TOOLS}
    if names is None:
        return [dict(t) for t in SANDBOX_TOOLS]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ConfigError(f"unknown tools {unknown or names}: choose from {', '.join(known)}")
    return [dict(known[n]) for n in names]


def _tool_message(call_id: str, name: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def make_format(
    kind: AgentFormat,
    tokenizer: Tokenizer,
    *,
    tool_parser: str | None = None,
    observation_role: str = "tool",
    system_prompt: str | None = None,
    tools: Sequence[str] | None = None,
) -> ActionFormat:
    if kind == "fenced":
        return FencedFormat(observation_role, system_prompt)
    if kind == "tools":
        return ToolFormat(tool_parser_for(tokenizer, tool_parser), system_prompt, tools)
    raise ConfigError(f"unknown agent format {kind!r}: use one of {', '.join(FORMATS)}")
