"""Environment variable templates in task files.

Harbor lets a task write ``env = { API_KEY = "${OPENAI_API_KEY}" }`` so that a secret stays out
of the task directory and is read from the host when the task runs. The same syntax works in
every env table of every format here: ``${NAME}`` and ``${NAME:-default}``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from sandrl.errors import TaskError

_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def resolve_env(env: Mapping[str, str], *, where: str, host_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Replace ``${NAME}`` / ``${NAME:-default}`` in the values with the host's variables.

    Raises :class:`~sandrl.errors.TaskError` naming the variable when one is unset and has no
    default, because a silently empty API key makes a verifier fail in a confusing way later.
    """
    source = os.environ if host_env is None else host_env
    out: dict[str, str] = {}
    for key, value in env.items():

        def substitute(match: re.Match[str], key: str = key) -> str:
            name, default = match.group(1), match.group(2)
            if name in source:
                return source[name]
            if default is not None:
                return default
            raise TaskError(
                f"{where}: {key} refers to ${{{name}}}, which is not set on this host; "
                f"export {name}=... before running the task (or write ${{{name}:-default}})"
            )

        out[key] = _TEMPLATE.sub(substitute, value)
    return out
