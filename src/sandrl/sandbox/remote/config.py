"""The settings of a :class:`~sandrl.sandbox.remote.provider.RemoteProvider`: timeouts, retries, pooling."""

from __future__ import annotations

from dataclasses import dataclass

from sandrl.errors import ConfigError

SERVER_ENV = "SANDRL_SERVER"
"""The environment variable naming the sandbox service's URL when a provider is given none."""


@dataclass(frozen=True)
class ClientConfig:
    """Timeouts, retries and pooling of a :class:`RemoteProvider`."""

    timeout_s: float = 60.0
    """Longest wait for an answer to a call other than exec (whose own timeout adds ``exec_margin_s``)."""
    connect_timeout_s: float = 5.0
    retries: int = 3
    """Attempts after the first, for the failures that may be retried (see :mod:`sandrl.sandbox.remote.provider`)."""
    backoff_s: float = 0.1
    """Wait before the first retry; doubles on each next one up to ``backoff_max_s``."""
    backoff_max_s: float = 2.0
    max_connections: int = 1024
    """Connections kept to the server: one per concurrent call."""
    create_wait_s: float = 0.0
    """How long a create queues on a full server (0: fail at once with capacity_exhausted)."""
    exec_margin_s: float = 30.0
    """Added to an exec's timeout_s for the HTTP wait (the server answers exec_timeout within 5 s)."""
    channel: bool = True
    """Send the calls whose bodies fit in memory (create, exec, close...) over the service's call channel
    (:mod:`sandrl.sandbox.remote.call_channel`): one connection, calls answered as they finish. Falls back
    to HTTP by itself on a server without one; plain ``http://`` only."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0 or self.exec_margin_s <= 0:
            raise ConfigError("client timeouts must be positive")
        if self.retries < 0 or self.backoff_s < 0 or self.max_connections < 1 or self.create_wait_s < 0:
            raise ConfigError("client retries, backoff and create_wait_s must be >= 0, max_connections >= 1")
