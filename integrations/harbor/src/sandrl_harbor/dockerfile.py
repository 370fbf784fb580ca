"""A task's Dockerfile, applied inside a fresh sandrl sandbox: how a Harbor task's environment is made here.

A sandrl host builds images itself (``sandrl images build``), but its HTTP API builds nothing for a
client. So this environment starts a sandbox from the image ``FROM`` names (an image of the host's
store: ``host``, ``debian``, a pulled one) and runs the rest of the Dockerfile in it, step by step:

- ``WORKDIR`` (made), ``ENV`` and ``ARG`` (defaults; ``$VAR``, ``${VAR}``, ``${VAR:-x}`` and
  ``${VAR:+x}`` expanded), ``USER`` (the default user of later commands), ``SHELL``;
- ``COPY`` / ``ADD`` of files of the build context (no URLs, archives are copied, not unpacked),
  ``--chown`` honoured;
- ``RUN`` as the user of that point, failing the start when a step fails.

``ENTRYPOINT``, ``CMD``, ``EXPOSE``, ``HEALTHCHECK``, ``LABEL``, ``VOLUME``, ``STOPSIGNAL`` do not
change the files and are skipped (Harbor starts task containers with ``sleep infinity`` anyway);
multi-stage builds and heredocs are refused. The Dockerfile is read by sandrl's own parser
(:mod:`sandrl.images.dockerfile`: continuations, the escape directive, Docker's quoting and
substitution rules), the one sandrl's image builder reads it with. The steps run on every start
(nothing is cached), with the network the task allows its agent: a ``RUN`` that downloads needs
``allow_internet``, or an image with it done already (``--ek image=NAME``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandrl.images.dockerfile import Instruction, argument_words, parse_dockerfile

SKIPPED = frozenset({"ENTRYPOINT", "CMD", "EXPOSE", "HEALTHCHECK", "LABEL", "VOLUME", "STOPSIGNAL", "MAINTAINER"})


class DockerfileError(ValueError):
    """A Dockerfile this environment cannot apply; the message names the file, the line and what to do."""


@dataclass(frozen=True)
class Plan:
    """``FROM``'s image and the steps after it."""

    base: str
    steps: list[Instruction]
    source: str


def step_text(step: Instruction) -> str:
    """The step as messages show it (its ``--flags`` left out)."""
    return f"{step.keyword} {step.args}"[:200]


def parse(text: str, source: str = "Dockerfile") -> Plan:
    """The plan of a single-stage Dockerfile (see the module); a Dockerfile that cannot be read
    raises :class:`~sandrl.errors.ImageBuildError`."""
    steps = parse_dockerfile(text, source)
    froms = [s for s in steps if s.keyword == "FROM"]
    if not froms or steps[0].keyword not in ("FROM", "ARG"):
        raise DockerfileError(f"{source}: starts with no FROM; write FROM host (or an image of the sandrl host)")
    if len(froms) > 1:
        raise DockerfileError(
            f"{source}:{froms[1].line}: a multi-stage build cannot be applied in a sandbox; build the image on the "
            "sandrl host (sandrl images build NAME -f Dockerfile) and pass --ek image=NAME"
        )
    if heredoc := next((s for s in steps if s.heredocs), None):
        raise DockerfileError(
            f"{source}:{heredoc.line}: heredocs (<<EOF) are not applied by the sandrl environment; put the script "
            "in a file of the build context and COPY it"
        )
    base = froms[0].args.split()[0] if froms[0].args.split() else ""
    after = [s for s in steps if s.line > froms[0].line]
    return Plan(base=base, steps=after, source=source)


def copy_sources(step: Instruction, context: Path, env: dict[str, str]) -> tuple[list[Path], str]:
    """The context paths a ``COPY``/``ADD`` takes (globs expanded, never outside the context) and its destination."""
    words = argument_words(step, env)
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
