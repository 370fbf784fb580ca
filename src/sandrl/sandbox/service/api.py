"""The sandbox service's wire types: request and response bodies of the native ``/v1`` API.

Shared by the server (:mod:`sandrl.sandbox.service.server`) and the client
(:mod:`sandrl.sandbox.client`), so the two cannot drift apart, and published in the
served OpenAPI document. Every error body is :class:`ErrorBody`.

Streaming exec (``POST /v1/sandboxes/{id}/exec/stream``) answers server-sent events, one
JSON object per ``data:`` line: ``started`` ``{"pid"}``, ``stdout`` / ``stderr``
``{"text"}`` (UTF-8, split on character boundaries), then exactly one of ``exit`` (an
:class:`ExecResponse` holding no output already sent) or ``error`` (an :class:`ErrorBody`).
Lines starting with ``:`` are keep-alives.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from sandrl.errors import SandrlError
from sandrl.sandbox.base import ExecResult, SandboxSpec

API_PREFIX = "/v1"
SSE_MEDIA_TYPE = "text/event-stream"
TAR_MEDIA_TYPE = "application/x-tar"
OCTET_MEDIA_TYPE = "application/octet-stream"

MetadataDict = Annotated[
    dict[Annotated[str, Field(min_length=1, max_length=256)], Annotated[str, Field(max_length=4096)]],
    Field(max_length=64),
]


class ServiceError(SandrlError):
    """An error the service answers with a status of its own (auth, body size, draining...)."""

    def __init__(self, message: str, *, error_code: str, http_status: int) -> None:
        super().__init__(message, error_code=error_code)
        self.http_status = http_status


class ErrorBody(BaseModel):
    """Every error the service answers: clients branch on ``error_code``, people read ``message``."""

    code: int = Field(description="The HTTP status.")
    error_code: str = Field(description="Machine-readable: sandbox_not_found, capacity_exhausted, invalid_spec...")
    message: str = Field(description="What went wrong and what to do about it.")


class SpecBody(BaseModel):
    """A :class:`~sandrl.sandbox.base.SandboxSpec`; the bounds are the spec's own."""

    model_config = ConfigDict(extra="forbid")

    image: str = Field(
        default="host", pattern=r"^[a-z0-9][a-z0-9._-]{0,127}$", description="An image in the server's store."
    )
    cpus: float = Field(default=1.0, ge=0.01, le=1024, allow_inf_nan=False, description="CPU quota in cores.")
    memory_mb: int = Field(default=2048, ge=16, le=1 << 22, description="Memory limit (the writable layer counts too).")
    pids: int = Field(default=512, ge=8, le=1 << 22, description="Most processes and threads at once.")
    disk_mb: int = Field(default=4096, ge=1, le=1 << 24, description="Size of the writable layer.")
    network: bool = Field(default=False, description="Share the host's network; loopback only when false.")
    ttl_s: float = Field(
        default=3600.0,
        ge=1,
        allow_inf_nan=False,
        description="Killed this long after creation; at least 1 s, at most the server's max.",
    )
    workdir: str = Field(
        default="/workspace", pattern=r"^/[^\x00]*$", max_length=4096, description="Default exec directory."
    )
    env: MetadataDict = Field(default_factory=dict, description="Environment of every exec.")
    require_limits: bool = Field(
        default=True, description="Fail rather than run without a limit the host cannot enforce."
    )

    def to_spec(self) -> SandboxSpec:
        return SandboxSpec(
            image=self.image,
            cpus=self.cpus,
            memory_mb=self.memory_mb,
            pids=self.pids,
            disk_mb=self.disk_mb,
            network=self.network,
            ttl_s=self.ttl_s,
            workdir=self.workdir,
            env=self.env,
            require_limits=self.require_limits,
        )

    @classmethod
    def from_spec(cls, spec: SandboxSpec) -> SpecBody:
        return cls.model_validate(spec.to_dict())


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


class ExecRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str = Field(max_length=1 << 20, description="Run by /bin/sh -c inside the sandbox.")
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

    @classmethod
    def of(cls, result: ExecResult) -> ExecResponse:
        return cls(
            exit_code=result.exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
            duration_s=result.duration_s,
            timed_out=result.timed_out,
            truncated=result.truncated,
        )

    def to_result(self) -> ExecResult:
        return ExecResult(
            exit_code=self.exit_code,
            stdout=self.stdout,
            stderr=self.stderr,
            duration_s=self.duration_s,
            timed_out=self.timed_out,
            truncated=self.truncated,
        )


class FileWritten(BaseModel):
    path: str
    size: int


class Health(BaseModel):
    status: str = Field(description="ok, or draining while the server shuts down.")
    live: int
    version: str
