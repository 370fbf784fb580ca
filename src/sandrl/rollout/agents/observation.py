"""The observation of one command: exit code, stdout and stderr, cut to a token budget.

Long output keeps its head and its tail (where errors and summaries are) with a marker
saying how much was left out; the budget is in tokens of the policy's tokenizer, so a long
``cat`` cannot blow the context.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandrl.inference.chat import ChatFormat
from sandrl.sandbox.base import ExecResult

FORMAT_ERROR = (
    "No command found. Reply with exactly one shell command in a fenced block:\n"
    "```bash\n<command>\n```\n"
    "or, when the task is done, with:\n```bash\nsubmit\n```"
)
"""The observation after a reply without a bash block."""


@dataclass(frozen=True)
class Observation:
    text: str
    truncated: bool


def cut(chat: ChatFormat, text: str, budget: int) -> tuple[str, bool]:
    """``text`` within ``budget`` tokens: head and tail halves and a marker, or unchanged if it fits."""
    ids = chat.encode(text)
    if len(ids) <= budget:
        return text, False
    head = budget // 2
    tail = budget - head
    omitted = len(ids) - head - tail
    return (
        chat.decode(ids[:head]) + f"\n[... {omitted} tokens omitted ...]\n" + chat.decode(ids[len(ids) - tail :]),
        True,
    )


def split_budget(stdout_len: int, stderr_len: int, budget: int) -> tuple[int, int]:
    """Share ``budget`` between two streams: each gets half, and what one does not need goes to the other."""
    half = budget // 2
    if stdout_len + stderr_len <= budget:
        return stdout_len, stderr_len
    if stderr_len <= half:
        return budget - stderr_len, stderr_len
    if stdout_len <= half:
        return stdout_len, budget - stdout_len
    return half, budget - half


def render(chat: ChatFormat, result: ExecResult, budget: int) -> Observation:
    """The observation text of a command's result."""
    out_len, err_len = len(chat.encode(result.stdout)), len(chat.encode(result.stderr))
    out_budget, err_budget = split_budget(out_len, err_len, budget)
    stdout, cut_out = cut(chat, result.stdout, out_budget)
    stderr, cut_err = cut(chat, result.stderr, err_budget)
    lines = [f"exit code: {result.exit_code}"]
    if result.timed_out:
        lines.append(f"(the command timed out after {result.duration_s:.1f} s and was killed)")
    if stdout:
        lines.append("stdout:\n" + stdout)
    if stderr:
        lines.append("stderr:\n" + stderr)
    return Observation("\n".join(lines), cut_out or cut_err or result.truncated)
