"""What the ``e2b`` SDK raises, as sandrl's typed errors: a failure of the service is the machinery's.

The SDK raises its own exception tree (``e2b.exceptions``), and below it the transports' errors
(``httpx``, Connect RPC's ``ConnectError``, pyqwest's, ``OSError``) when a service cannot be
reached. An episode must see each as a :class:`~sandrl.errors.SandboxError`, so that it ends as an
``infra_error`` (retried when another attempt may pass) and never as the policy's reward 0:

============================================  =============================================  ==========
SDK / transport                               sandrl                                         retried
============================================  =============================================  ==========
sandbox not running / not found               SandboxClosedError ``sandbox_closed``          yes
unreachable, connection refused or lost, 5xx  SandboxHostLostError ``e2b_unreachable``       yes
429 rate limit, 503 busy                      CapacityExhaustedError                         yes
a request or stream timed out                 SandboxError ``service_timeout``               yes
template not found (create's 404)             ImageNotFoundError ``image_not_found``         no
create refused (400: a setting it cannot run)  SandboxUnavailableError ``create_refused``     no
API key refused (401/403)                     SandboxUnavailableError ``e2b_auth``           no
file missing / a directory / disk full        SandboxFileError (``file_not_found``...)       (caller)
anything else the SDK raises                  SandboxError ``e2b_error``                     yes
============================================  =============================================  ==========

A command's own exit status is never an error (:class:`~sandrl.sandbox.base.ExecResult`).
Through E2B's API a sandbox that died cannot be told from one killed by its own processes (the
local backend tells, :class:`~sandrl.errors.SandboxCrashedError`): both are ``sandbox_closed``.
"""

from __future__ import annotations

import errno

import httpx
from connectrpc.errors import ConnectError
from e2b import (
    AuthenticationException,
    FileNotFoundException,
    InvalidArgumentException,
    NotEnoughSpaceException,
    RateLimitException,
    SandboxException,
    SandboxNotFoundException,
    SandboxNotRunningException,
    SandboxUnreachableException,
    ServiceBusyException,
    TimeoutException,
)

from sandrl.errors import (
    CapacityExhaustedError,
    ImageNotFoundError,
    SandboxClosedError,
    SandboxError,
    SandboxFileError,
    SandboxHostLostError,
    SandboxUnavailableError,
    SandrlError,
)

UNREACHABLE = "e2b_unreachable"
RETRYABLE_CREATE = (CapacityExhaustedError, SandboxHostLostError)
"""Create failures worth another try after a wait: the service is full, busy, restarting or unreachable."""
_TRANSPORT = (httpx.TransportError, ConnectError, OSError)


def _short(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sandrl_error(exc: Exception, *, what: str, service: str, file_op: bool = False) -> SandrlError:
    """The sandrl error for ``exc``, raised by the SDK while doing ``what`` (e.g. ``exec in sb-1``).

    ``service`` names the service for messages; ``file_op`` marks a file transfer, whose argument
    errors (a directory, a path under a file) are :class:`~sandrl.errors.SandboxFileError`.
    """
    if isinstance(exc, SandrlError):
        return exc
    detail = _short(exc)
    if isinstance(exc, SandboxNotRunningException | SandboxNotFoundException):
        return SandboxClosedError(
            f"{what}: the sandbox is no longer running on the E2B service at {service} (killed, past its timeout, "
            f"or lost by the service): {detail}"
        )
    if isinstance(exc, (SandboxUnreachableException, *_TRANSPORT)):
        return SandboxHostLostError(
            f"{what}: the E2B service at {service} could not be reached or dropped the connection "
            f"({type(exc).__name__}: {detail}); check that it runs (E2B_API_URL / E2B_DOMAIN), the episode is retried",
            error_code=UNREACHABLE,
        )
    if isinstance(exc, FileNotFoundException):
        return SandboxFileError(f"{what}: {detail}", errno=errno.ENOENT, error_code="file_not_found")
    if isinstance(exc, NotEnoughSpaceException):
        return SandboxFileError(
            f"{what}: the sandbox's disk is full: {detail}", errno=errno.ENOSPC, error_code="disk_full"
        )
    if isinstance(exc, InvalidArgumentException) and file_op:
        return SandboxFileError(f"{what}: {detail}")
    if isinstance(exc, RateLimitException | ServiceBusyException):
        return CapacityExhaustedError(
            f"{what}: the E2B service at {service} is full or rate-limiting ({detail}); lower the create "
            "concurrency ([rollout] create_concurrency) or the episodes at once"
        )
    if isinstance(exc, AuthenticationException):
        return SandboxUnavailableError(
            f"{what}: the E2B service at {service} refused the API key ({detail}): set E2B_API_KEY to a key it "
            "accepts (for a sandrl service, its token)",
            error_code="e2b_auth",
        )
    if isinstance(exc, TimeoutException):
        return SandboxError(
            f"{what}: the E2B service at {service} did not answer in time ({detail})", error_code="service_timeout"
        )
    status = exc.status_code if isinstance(exc, SandboxException) else None
    if status is not None and status >= 500:
        return SandboxHostLostError(
            f"{what}: the E2B service at {service} failed (HTTP {status}: {detail})", error_code=UNREACHABLE
        )
    return SandboxError(f"{what}: the E2B SDK raised {type(exc).__name__}: {detail}", error_code="e2b_error")


def create_error(exc: Exception, *, template: str, service: str) -> SandrlError:
    """The sandrl error of a failed create from ``template``: a missing template and a refused create are
    not worth retrying, and say what to do."""
    status = exc.status_code if isinstance(exc, SandboxException) else None
    detail = _short(exc)
    if status == 404:
        return ImageNotFoundError(
            f"the E2B service at {service} has no template {template!r} ({detail}). On a sandrl host, make it there: "
            "`sandrl images templates TASKS --build` builds every task's template under the name sandrl gives it; on "
            f"E2B, build a template named {template} from the task's Dockerfile (e2b template build)"
        )
    if status == 400:
        return SandboxUnavailableError(
            f"the E2B service at {service} refused to create a sandbox of template {template!r}: {detail}",
            error_code="create_refused",
        )
    return sandrl_error(exc, what=f"creating a sandbox of template {template!r}", service=service)
