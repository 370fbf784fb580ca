"""ENTRYPOINT, CMD, EXPOSE and HEALTHCHECK: the image config a Dockerfile gives its sandboxes, by Docker's rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sandrl.images.dockerfile import Instruction, json_array, words

__all__ = ["RUNTIME_KEYS", "runtime_step"]

RUNTIME_KEYS = ("entrypoint", "cmd", "exposed_ports", "healthcheck")
"""The parts of an image's config a sandbox of it uses, inherited from ``FROM`` as Docker does."""


def _command(inst: Instruction, text: str, shell: Sequence[str]) -> list[str]:
    """A CMD/ENTRYPOINT/HEALTHCHECK command as Docker stores it: the JSON form as written, the
    shell form through the current ``SHELL``."""
    if inst.exec_form is not None:
        return list(inst.exec_form)
    if not text.strip():
        raise inst.error("needs a command")
    return [*shell, text]


def runtime_step(inst: Instruction, runtime: dict[str, object], shell: Sequence[str], env: Mapping[str, str]) -> None:
    """ENTRYPOINT, CMD, EXPOSE, HEALTHCHECK: the image config's fields, with Docker's rules."""
    if inst.keyword == "ENTRYPOINT":
        runtime["entrypoint"] = _command(inst, inst.args, shell)
        runtime.pop("cmd", None)  # Docker: a new ENTRYPOINT drops the CMD inherited from FROM
    elif inst.keyword == "CMD":
        runtime["cmd"] = _command(inst, inst.args, shell)
    elif inst.keyword == "EXPOSE":
        ports = runtime.get("exposed_ports")
        known = list(ports) if isinstance(ports, list) else []
        for port in words(inst.args, env, inst.where):
            entry = port if "/" in port else f"{port}/tcp"
            if entry not in known:
                known.append(entry)
        runtime["exposed_ports"] = known
    else:
        text = inst.args.strip()
        head, _, rest = text.partition(" ")
        if head.upper() == "NONE":
            runtime.pop("healthcheck", None)
        elif head.upper() == "CMD":
            # Options (--interval...) are not kept: only the command, which is how sandrl uses it.
            command = rest.strip()
            form = json_array(command)
            runtime["healthcheck"] = ["CMD", *form] if form is not None else ["CMD-SHELL", command]
        else:
            raise inst.error("write HEALTHCHECK [OPTIONS] CMD <command>, or HEALTHCHECK NONE")
