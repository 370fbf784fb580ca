"""The service's own refusals: an error answered with a status of its own (auth, body size, draining...)."""

from __future__ import annotations

from sandrl.errors import SandrlError


class ServiceError(SandrlError):
    """An error the service answers with a status of its own (auth, body size, draining...)."""

    def __init__(self, message: str, *, error_code: str, http_status: int) -> None:
        super().__init__(message, error_code=error_code)
        self.http_status = http_status
