"""What the model's reply asks for: a shell command in a fenced ``bash`` block, or to finish.

The convention the system prompt teaches::

    ```bash
    ls -la
    ```

runs ``ls -la``; the first such block of a reply is the command (a block fenced as ``sh`` or
``shell`` counts too). A block holding only ``submit`` finishes the episode. A reply with no
block is a format error: the agent says so in the observation and the episode goes on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

SUBMIT = "submit"
"""The command that ends the episode; the sandbox's state is then verified."""

_BLOCK = re.compile(r"```(?:bash|sh|shell)[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Action:
    kind: Literal["command", "submit", "none"]
    command: str | None = None


def parse_action(reply: str) -> Action:
    """The action of one model reply (its decoded text, template tokens included or not)."""
    match = _BLOCK.search(reply)
    if match is None:
        return Action("none")
    command = match.group(1).strip()
    if command == SUBMIT:
        return Action("submit")
    if not command:
        return Action("none")
    return Action("command", command)
