"""What the E2B-compatible API keeps per sandbox, beside the service's own :class:`~sandrl.sandbox.service.Entry`.

Each sandbox the E2B side hands out gets an *envd access token*: the SDK is given it in the
create (or connect) answer as ``envdAccessToken`` and sends it back on every in-sandbox call as
``X-Access-Token``, so only a client that could create or connect to the sandbox with the API
key can reach its processes and files. A sandbox made through the native ``/v1`` API gets its
record (and token) the first time an E2B client connects to it.

Without the right token an envd call learns nothing: a live sandbox, one never connected
through E2B and an id that never existed get the same refusal (:data:`REFUSAL`), so sandbox ids
cannot be probed. Only a caller holding the token of a sandbox that is gone is told it is gone
(the SDK raises that as "not running"); the tokens of the last :data:`RECENT_GONE` are kept
for that.
"""

from __future__ import annotations

import hmac
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from sandrl.sandbox.service.e2b.process_table import ProcessTable
from sandrl.sandbox.service.state import Entry, SandboxService

ENVD_VERSION = "0.5.7"
"""The envd version sandrl answers with. The SDK gates features on it: 0.5.7 is the first with
octet-stream uploads (0.5.2 close-stdin, 0.4.0 a default user); file metadata (0.6.2) and watch
options newer than that stay off, so the SDK itself refuses them with its own message."""
ENVD_PORT = 49983
"""The port the SDK names in ``E2b-Sandbox-Port`` for envd traffic."""
CLIENT_ID = "sandrl"
DEFAULT_TEMPLATE = "base"
"""E2B's default template; it maps to sandrl's default image, ``host``."""
RECENT_GONE = 4096
REFUSAL = (
    "missing or wrong X-Access-Token for this sandbox, or no such sandbox: send the envdAccessToken "
    "of the sandbox's create or connect answer (a sandbox made through /v1 needs Sandbox.connect(id) first)"
)
"""The one answer to an envd call without the right token, whether or not its sandbox exists."""
_DUMMY_TOKEN = secrets.token_urlsafe(32)


@dataclass
class E2BSandbox:
    id: str
    template: str
    access_token: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)
    processes: ProcessTable | None = field(default=None, repr=False)
    cpu_sample: tuple[float, float] | None = field(default=None, repr=False)
    """The last metrics read: (unix time, the sandbox's CPU seconds), for the CPU share since then."""

    def token_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.access_token.encode())


class E2BRegistry:
    """The E2B records of the service's live sandboxes; a record goes when its sandbox does."""

    def __init__(self, service: SandboxService) -> None:
        self.service = service
        self._records: dict[str, E2BSandbox] = {}
        self._gone: OrderedDict[str, str] = OrderedDict()
        """The access tokens of sandboxes gone lately, by id."""

    def add(self, entry: Entry, template: str) -> E2BSandbox:
        self.prune()
        record = E2BSandbox(entry.id, template)
        self._records[entry.id] = record
        return record

    def of(self, entry: Entry) -> E2BSandbox:
        """The record of a live sandbox, made now if the sandbox came through the native API."""
        record = self._records.get(entry.id)
        if record is None:
            record = self.add(entry, entry.spec.image if entry.spec.image != "host" else DEFAULT_TEMPLATE)
        return record

    def find(self, sandbox_id: str) -> tuple[Entry, E2BSandbox] | None:
        """The live sandbox and its record, or None when either is missing."""
        entry = self.service.entries.get(sandbox_id)
        record = self._records.get(sandbox_id)
        if entry is None:
            if record is not None:
                self._drop(sandbox_id)
            return None
        if record is None:
            return None
        return entry, record

    def template_of(self, entry: Entry) -> str:
        record = self._records.get(entry.id)
        if record is not None:
            return record.template
        return DEFAULT_TEMPLATE if entry.spec.image == "host" else entry.spec.image

    def prune(self) -> None:
        for sid in [s for s in self._records if s not in self.service.entries]:
            self._drop(sid)

    def _drop(self, sandbox_id: str) -> None:
        record = self._records.pop(sandbox_id, None)
        if record is None:
            return
        self._gone[sandbox_id] = record.access_token
        while len(self._gone) > RECENT_GONE:
            self._gone.popitem(last=False)
        if record.processes is not None:
            record.processes.forget()

    def gone_token_ok(self, sandbox_id: str, given: str | None) -> bool:
        """Whether ``given`` is the access token a sandbox had before it went."""
        token = self._gone.get(sandbox_id)
        return given is not None and token is not None and hmac.compare_digest(given.encode(), token.encode())


class Refused(Exception):
    """An envd call that cannot reach its sandbox: ``kind`` is unauthenticated, not_found or port."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def resolve(registry: E2BRegistry, headers: Mapping[str, str]) -> tuple[Entry, E2BSandbox]:
    """The sandbox an envd call is for (its ``E2b-Sandbox-Id``), checked against its ``X-Access-Token``.

    ``headers`` is looked up by lower-case names (both Starlette's and connectrpc's headers are).
    """
    sandbox_id, port, token = (headers.get(h) for h in ("e2b-sandbox-id", "e2b-sandbox-port", "x-access-token"))
    if not sandbox_id:
        raise Refused("not_found", "no E2b-Sandbox-Id header: envd calls name their sandbox in it")
    if port and port != str(ENVD_PORT):
        raise Refused(
            "port",
            f"sandbox {sandbox_id}: port {port} is not open: sandrl serves envd (port {ENVD_PORT}) only; "
            "reaching other ports of a sandbox is not supported yet",
        )
    found = registry.find(sandbox_id)
    if found is None:
        if registry.gone_token_ok(sandbox_id, token):
            why = registry.service.recent.get(sandbox_id)
            raise Refused("not_found", f"The sandbox {sandbox_id} was not found" + (f" ({why})" if why else ""))
        hmac.compare_digest((token or "").encode(), _DUMMY_TOKEN.encode())  # as long as a real check
        raise Refused("unauthenticated", REFUSAL)
    entry, record = found
    if not record.token_ok(token):
        raise Refused("unauthenticated", REFUSAL)
    return entry, record
