"""A task's Dockerfile, applied inside a fresh sandrl sandbox: how a Harbor task's environment is made here.

A sandrl host builds images itself (``sandrl images build``), but its HTTP API builds nothing for a
client. So this environment starts a sandbox from the image ``FROM`` names (an image of the host's
store: ``host``, ``debian``, a pulled one) and runs the rest of the Dockerfile in it, step by step:

- ``WORKDIR`` (made), ``ENV`` and ``ARG`` (defaults; ``$VAR`` and ``${VAR}`` expanded), ``USER``
  (the default user of later commands), ``SHELL``;
- ``COPY`` / ``ADD`` of files of the build context (no URLs, archives are copied, not unpacked),
  ``--chown`` honoured;
- ``RUN`` as the user of that point, failing the start when a step fails.

``ENTRYPOINT``, ``CMD``, ``EXPOSE``, ``HEALTHCHECK``, ``LABEL``, ``VOLUME``, ``STOPSIGNAL`` do not
change the files and are skipped (Harbor starts task containers with ``sleep infinity`` anyway);
multi-stage builds are refused. The steps run on every start (nothing is cached), with the
network the task allows its agent: a ``RUN`` that downloads needs ``allow_internet``, or an image
with it done already (``--ek image=NAME``).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

_KEYWORD = re.compile(r"^([A-Za-z]+)(?:\s+(.*))?$", re.DOTALL)
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
SKIPPED = frozenset({"ENTRYPOINT", "CMD", "EXPOSE", "HEALTHCHECK", "LABEL", "VOLUME", "STOPSIGNAL", "MAINTAINER"})


class DockerfileError(ValueError):
    """A Dockerfile this environment cannot apply; the message names the file, the line and what to do."""


@dataclass(frozen=True)
class Step:
    keyword: str
    args: str
    line: int
    flags: dict[str, str] = field(default_factory=dict)
    exec_form: list[str] | None = None

    @property
    def text(self) -> str:
        return f"{self.keyword} {self.args}"[:200]


@dataclass(frozen=True)
class Plan:
    """``FROM``'s image and the steps after it."""

    base: str
    steps: list[Step]
    source: str


def parse(text: str, source: str = "Dockerfile") -> Plan:
    """The plan of a single-stage Dockerfile (see the module)."""
    steps: list[Step] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continuation are dropped, as Docker does
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        steps.append(_step(pending + stripped, start, source))
        pending = ""
    if pending:
        steps.append(_step(pending, start, source))
    froms = [s for s in steps if s.keyword == "FROM"]
    if not froms or steps[0].keyword not in ("FROM", "ARG"):
        raise DockerfileError(f"{source}: starts with no FROM; write FROM host (or an image of the sandrl host)")
    if len(froms) > 1:
        raise DockerfileError(
            f"{source}:{froms[1].line}: a multi-stage build cannot be applied in a sandbox; build the image on the "
            "sandrl host (sandrl images build NAME -f Dockerfile) and pass --ek image=NAME"
        )
    base = froms[0].args.split()[0] if froms[0].args.split() else ""
    after = [s for s in steps if s.line > froms[0].line]
    return Plan(base=base, steps=after, source=source)


def _step(text: str, line: int, source: str) -> Step:
    match = _KEYWORD.match(text.strip())
    if match is None:
        raise DockerfileError(f"{source}:{line}: cannot read {text[:80]!r}")
    keyword, args = match.group(1).upper(), (match.group(2) or "").strip()
    flags: dict[str, str] = {}
    while args.startswith("--"):
        flag, _, rest = args.partition(" ")
        name, _, value = flag[2:].partition("=")
        flags[name] = value or "true"
        args = rest.strip()
    exec_form = None
    if args.startswith("["):
        try:
            parsed = json.loads(args)
        except ValueError:
            parsed = None
        if isinstance(parsed, list) and all(isinstance(a, str) for a in parsed):
            exec_form = parsed
    return Step(keyword, args, line, flags, exec_form)


def expand(text: str, env: dict[str, str]) -> str:
    """``$VAR``, ``${VAR}`` and ``${VAR:-default}`` from ``env`` (unknown: empty), as Docker expands them."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        value = env.get(name, "")
        return value if value or m.group(2) is None else m.group(2)

    return _VAR.sub(one, text)


def key_values(step: Step, env: dict[str, str]) -> list[tuple[str, str | None]]:
    """The ``NAME=value`` pairs of an ``ENV`` or ``ARG`` (``ENV NAME value`` too; an ``ARG`` may have no value)."""
    words = shlex.split(step.args)
    if step.keyword == "ENV" and words and "=" not in words[0]:
        return [(words[0], expand(" ".join(words[1:]), env))]
    pairs: list[tuple[str, str | None]] = []
    for word in words:
        name, sep, value = word.partition("=")
        pairs.append((name, expand(value, env) if sep else None))
    return pairs


def copy_sources(step: Step, context: Path, env: dict[str, str]) -> tuple[list[Path], str]:
    """The context paths a ``COPY``/``ADD`` takes (globs expanded, never outside the context) and its destination."""
    words = step.exec_form if step.exec_form is not None else shlex.split(step.args)
    words = [expand(w, env) for w in words]
    if len(words) < 2:
        raise DockerfileError(f"{step.keyword} at line {step.line} needs a source and a destination")
    if "from" in step.flags:
        raise DockerfileError(f"line {step.line}: COPY --from needs a multi-stage build, which is not applied here")
    root = context.resolve()
    sources: list[Path] = []
    for pattern in words[:-1]:
        if "://" in pattern:
            raise DockerfileError(f"line {step.line}: ADD of a URL is not applied here; download it in a RUN step")
        matched = sorted(root.glob(pattern.lstrip("/"))) if any(c in pattern for c in "*?[") else [root / pattern]
        for path in matched:
            resolved = path.resolve()
            if not resolved.is_relative_to(root) or not path.exists():
                raise DockerfileError(f"line {step.line}: {pattern} is not a file of the build context {context}")
            sources.append(path)
    return sources, words[-1]
