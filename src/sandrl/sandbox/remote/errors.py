"""The sandbox service's error answers as sandrl's typed errors: the server's ``error_code`` and message kept."""

from __future__ import annotations

import json
from typing import Any, Protocol

from sandrl.errors import (
    CapacityExhaustedError,
    ConfigError,
    ImageNotFoundError,
    InvalidSpecError,
    LimitUnsupportedError,
    SandboxClosedError,
    SandboxCrashedError,
    SandboxError,
    SandboxFileError,
    SandboxFileTooLargeError,
    SandboxNotFoundError,
    SandboxRequestTooLargeError,
    SandboxUnavailableError,
    SandrlError,
)

_ERRORS: dict[str, type[SandrlError]] = {
    "sandbox_not_found": SandboxNotFoundError,
    "sandbox_closed": SandboxClosedError,
    "sandbox_crashed": SandboxCrashedError,
    "file_too_large": SandboxFileTooLargeError,
    "request_too_large": SandboxRequestTooLargeError,
    "capacity_exhausted": CapacityExhaustedError,
    "invalid_spec": InvalidSpecError,
    "limit_unsupported": LimitUnsupportedError,
    "image_not_found": ImageNotFoundError,
    "file_error": SandboxFileError,
    "file_not_found": SandboxFileError,
    "disk_full": SandboxFileError,
    "service_draining": SandboxUnavailableError,
    "sandbox_unavailable": SandboxUnavailableError,
}


class Answered(Protocol):
    """What the policy reads of an answer: an ``httpx.Response`` or the pool's ``Answer``."""

    @property
    def status_code(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def reason_phrase(self) -> str: ...
    def json(self) -> Any: ...
    async def aread(self) -> bytes: ...
    async def aclose(self) -> None: ...


def error_from(method: str, url: str, response: Answered) -> SandrlError:
    """The typed error for an error answer, keeping the server's error_code and message."""
    error_code, message = "http_error", response.text[:500] or response.reason_phrase
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict):
        error_code = str(body.get("error_code") or error_code)
        message = str(body.get("message") or message)
    return typed_error(error_code, message, response.status_code)


def typed_error(error_code: str, message: str, status: int) -> SandrlError:
    """The class of :mod:`sandrl.errors` for ``error_code`` (by the status when the code is not one of them)."""
    cls = _ERRORS.get(error_code)
    if cls is None:
        cls = ConfigError if 400 <= status < 500 else SandboxError
    error = cls(message, error_code=error_code)
    error.http_status = status
    return error
