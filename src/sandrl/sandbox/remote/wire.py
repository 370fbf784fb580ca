"""The sandbox service's wire types: request and response bodies of the native ``/v1`` API.

Shared by the server (:mod:`sandrl.sandbox.service.routes`) and the client
(:mod:`sandrl.sandbox.remote.provider`), so the two cannot drift apart, and published in the
served OpenAPI document. Every error body is :class:`ErrorBody`. This module imports no server
code (no FastAPI, nothing of :mod:`sandrl.sandbox.service`): a client loads none.

Streaming exec (``POST /v1/sandboxes/{id}/exec/stream``) answers server-sent events, one
JSON object per ``data:`` line: ``started`` ``{"pid"}``, ``stdout`` / ``stderr``
``{"text"}`` (UTF-8, split on character boundaries), then exactly one of ``exit`` (an
:class:`ExecResponse` holding no output already sent) or ``error`` (an :class:`ErrorBody`).
Lines starting with ``:`` are keep-alives.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from sandrl.sandbox.base import IMAGE_NAME_PATTERN, WORKDIR_PATTERN, Bounds, ExecResult, SandboxSpec
from sandrl.sandbox.command import MAX_ARGS

API_PREFIX = "/v1"
TOKEN_ENV = "SANDRL_TOKEN"
"""The environment variable that holds the service's bearer token, for the server and its clients."""
SSE_MEDIA_TYPE = "text/event-stream"
TAR_MEDIA_TYPE = "application/x-tar"
OCTET_MEDIA_TYPE = "application/octet-stream"

MetadataDict = Annotated[
    dict[Annotated[str, Field(min_length=1, max_length=256)], Annotated[str, Field(max_length=4096)]],
    Field(max_length=64),
]


class ErrorBody(BaseModel):
    """Every error the service answers: clients branch on ``error_code``, people read ``message``."""

    code: int = Field(description="The HTTP status.")
    error_code: str = Field(description="Machine-readable: sandbox_not_found, capacity_exhausted, invalid_spec...")
    message: str = Field(description="What went wrong and what to do about it.")


MIN_TTL_S = 1.0
"""The shortest TTL a create may ask for (a shorter one could expire before the sandbox has started);
the spec itself takes any positive one."""
_SPEC_FIELDS = {f.name: f for f in dataclasses.fields(SandboxSpec)}


def _from_spec(name: str, description: str, **api: Any) -> Any:
    """The ``Field`` of :class:`SpecBody` for the spec's field ``name``: its default and its
    :class:`~sandrl.sandbox.base.Bounds` are the spec's own; ``api`` adds the API's own limits
    (a length cap, the service's shortest TTL), replacing the spec's low bound where it gives one."""
    spec_field = _SPEC_FIELDS[name]
    bounds = spec_field.metadata.get("bounds")
    constraints: dict[str, Any] = bounds.constraints() if isinstance(bounds, Bounds) else {}
    if "ge" in api or "gt" in api:
        constraints.pop("ge", None)
        constraints.pop("gt", None)
    constraints.update(api)
    if spec_field.default_factory is not dataclasses.MISSING:
        factory = spec_field.default_factory
        return Field(default_factory=lambda: dict(factory()), description=description, **constraints)
    return Field(default=spec_field.default, description=description, **constraints)


class SpecBody(BaseModel):
    """A :class:`~sandrl.sandbox.base.SandboxSpec`; the bounds are the spec's own."""

    # One field per field of the spec, with the spec's default and bounds (see _from_spec); only
    # the names, the types and the descriptions are written here, and check_spec_body() checks
    # at import that no field of the spec is missing.
    model_config = ConfigDict(extra="forbid")

    image: str = _from_spec("image", "An image in the server's store.", pattern=IMAGE_NAME_PATTERN)
    cpus: float = _from_spec("cpus", "CPU quota in cores.")
    memory_mb: int = _from_spec("memory_mb", "Memory limit (the writable layer counts too).")
    pids: int = _from_spec("pids", "Most processes and threads at once.")
    disk_mb: int = _from_spec("disk_mb", "Size of the writable layer.")
    network: bool = _from_spec(
        "network", "Egress through NAT (never the host or its private network); loopback only when false."
    )
    ttl_s: float = _from_spec(
        "ttl_s", "Killed this long after creation; at least 1 s, at most the server's max.", ge=MIN_TTL_S
    )
    workdir: str = _from_spec("workdir", "Default exec directory.", pattern=WORKDIR_PATTERN, max_length=4096)
    env: MetadataDict = _from_spec("env", "Environment of every exec.")
    require_limits: bool = _from_spec("require_limits", "Fail rather than run without a limit the host cannot enforce.")
    entrypoint: bool = _from_spec("entrypoint", "Start the image's ENTRYPOINT after create (Docker's semantics).")

    def to_spec(self) -> SandboxSpec:
        return SandboxSpec(**self.model_dump(include=set(_SPEC_FIELDS)))

    @classmethod
    def from_spec(cls, spec: SandboxSpec) -> SpecBody:
        return cls.model_validate(spec.to_dict())


def check_spec_body() -> None:
    """SpecBody has exactly the spec's fields (a field added to the spec must be added to the API)."""
    if set(SpecBody.model_fields) != set(_SPEC_FIELDS):
        raise TypeError(
            f"SpecBody's fields {sorted(SpecBody.model_fields)} are not SandboxSpec's {sorted(_SPEC_FIELDS)}"
        )


check_spec_body()


class CreateRequest(SpecBody):
    """``POST /v1/sandboxes``: a spec, labels, and how long to queue when the server is full."""

    metadata: MetadataDict = Field(default_factory=dict, description="Labels, to find the sandbox again (list filter).")
    wait_s: float = Field(
        default=0.0,
        ge=0,
        allow_inf_nan=False,
        description="When the server is full, queue up to this long (clamped to the server's max) "
        "instead of failing at once with capacity_exhausted.",
    )


class SandboxInfo(BaseModel):
    id: str
    spec: SpecBody
    metadata: dict[str, str]
    created_at: float = Field(description="Unix time.")
    expires_at: float = Field(description="Unix time at which the server kills it unless its timeout is extended.")


class SandboxList(BaseModel):
    sandboxes: list[SandboxInfo]


class TimeoutRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ttl_s: float = Field(gt=0, allow_inf_nan=False, description="Seconds to live from now; at most the server's max.")


ShellLine = Annotated[str, Field(max_length=1 << 20)]
Argv = Annotated[list[str], Field(min_length=1, max_length=MAX_ARGS)]


class ExecRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: ShellLine | Argv = Field(
        description="A string is a shell command line, run by /bin/sh -c; a list of strings is an argv, run "
        "directly with no shell (the program looked up in PATH unless it holds a '/'; 127 when it is not "
        "there, 126 when it cannot run), at most 1 MiB in all."
    )
    timeout_s: float = Field(default=60.0, gt=0, le=86400, allow_inf_nan=False, description="Exit code 124 when hit.")
    cwd: str | None = Field(default=None, max_length=4096, description="Working directory; default the spec's workdir.")
    env: MetadataDict | None = Field(default=None, description="Added to the spec's environment.")
    stdin: str | None = Field(default=None, description="Text fed to the command's stdin, then closed.")
    stdin_b64: str | None = Field(default=None, description="Bytes (base64) fed to stdin; instead of stdin.")


class ExecResponse(BaseModel):
    exit_code: int = Field(description="-N when killed by signal N; 124 on timeout.")
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool
    truncated: bool = Field(description="An output stream hit the output cap and was cut.")

    # The same fields as ExecResult, by name.
    @classmethod
    def of(cls, result: ExecResult) -> ExecResponse:
        return cls(**dataclasses.asdict(result))

    def to_result(self) -> ExecResult:
        return ExecResult(**self.model_dump())


class FileWritten(BaseModel):
    path: str
    size: int


class ChannelInfo(BaseModel):
    """The answer of ``GET /v1/channel`` when it opens the call channel (see :mod:`.channel_frames`)."""

    # The docstring is the OpenAPI document's description, kept byte for byte (#38): the framing is :mod:`.frames`.

    max_call_bytes: int = Field(description="Longest body of a call on the channel; longer ones are answered 413.")


class Health(BaseModel):
    status: str = Field(description="ok, or draining while the server shuts down.")
    live: int
    version: str
