"""What a command given to :meth:`Sandbox.exec <sandrl.sandbox.base.Sandbox.exec>` may be.

Two forms, one meaning each:

- a **string** is a shell command line, run by ``/bin/sh -c`` (E2B: ``bash -l -c``) as always:
  pipes, redirections, ``&&``, ``$VAR`` all work. What a model writes is one.
- a **list** (or tuple) of strings is an argv, run directly with ``execve``: no shell starts, nothing
  in an argument is expanded or split (``$HOME`` and ``;`` reach the program as written). A program
  name without ``/`` is looked up in the command's ``PATH`` (the sandbox's environment with the call's
  ``env`` over it), as a shell would; a name with ``/`` is used as given (relative to ``cwd``). A
  program that is not there exits 127, one that cannot be run (not executable, not a binary nor a
  ``#!`` script: no shell runs it instead) 126, each with a line on stderr saying why: what a shell
  says for the same. For commands sandrl composes itself (``["tail", "-c", "4096", path]``): a
  shell's start-up is most of the cost of a short command.

:func:`check_command` is the one check of both forms, which every backend and the HTTP API apply.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from sandrl.errors import InvalidCommandError

Command = str | Sequence[str]
"""A shell command line (``str``) or an argv run without a shell (a list or tuple of ``str``)."""
CheckedCommand = str | tuple[str, ...]
"""A :data:`Command` after :func:`check_command`: an argv is a tuple, so a caller's list may change after."""

MAX_ARGS = 32768
"""Most arguments of an argv (the program included)."""
MAX_ARGV_BYTES = 1 << 20
"""Most bytes of an argv's arguments together, as UTF-8, each counted with its terminating NUL: as much
as the HTTP API takes of a shell command line (Linux's own limit is lower for one argument: 128 KiB)."""

_FORMS = "a string (a shell command line, run by /bin/sh -c) or a list of strings (an argv, run without a shell)"


def check_command(command: object) -> CheckedCommand:
    """``command`` checked: a string without NUL bytes, or a non-empty list or tuple of at most
    :data:`MAX_ARGS` strings (the first not empty) without NUL bytes, of at most :data:`MAX_ARGV_BYTES`
    in all. Anything else raises :class:`~sandrl.errors.InvalidCommandError` saying what is wrong."""
    if isinstance(command, str):
        if "\0" in command:
            raise InvalidCommandError("a command cannot contain NUL bytes")
        return command
    if not isinstance(command, list | tuple):
        raise InvalidCommandError(f"a command must be {_FORMS}, got {type(command).__name__}")
    if not command:
        raise InvalidCommandError("an argv command cannot be empty: give at least the program to run")
    if len(command) > MAX_ARGS:
        raise InvalidCommandError(f"an argv command has {len(command)} arguments, over the limit of {MAX_ARGS}")
    size = 0
    for i, arg in enumerate(command):
        if not isinstance(arg, str):
            raise InvalidCommandError(
                f"argument {i} of an argv command is {type(arg).__name__}, not a string: {_FORMS}"
            )
        if "\0" in arg:
            raise InvalidCommandError(
                f"argument {i} of an argv command contains a NUL byte, which no argument can hold"
            )
        try:
            size += len(arg.encode()) + 1
        except UnicodeEncodeError as exc:
            raise InvalidCommandError(f"argument {i} of an argv command is not valid Unicode: {exc}") from None
    if not command[0]:
        raise InvalidCommandError("the program of an argv command (its first argument) cannot be empty")
    if size > MAX_ARGV_BYTES:
        raise InvalidCommandError(
            f"an argv command of {size} bytes is over the limit of {MAX_ARGV_BYTES} bytes: pass large inputs "
            "through stdin or write them to a file with write_file"
        )
    return tuple(command)


def shell_line(command: CheckedCommand) -> str:
    """``command`` as a shell command line, for a backend that can only run one through a shell (E2B's
    envd): an argv is quoted with :func:`shlex.join`, so the shell splits it back into the same arguments
    and expands none of them."""
    return command if isinstance(command, str) else shlex.join(command)


def describe(command: Command) -> str:
    """``command`` for a message or a record: a string as it is, an argv quoted as a shell would need it."""
    return shell_line(command if isinstance(command, str) else tuple(command))
