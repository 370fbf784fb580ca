"""A client of the registry HTTP API v2 (the OCI distribution spec): manifests and blobs, checked.

- **Where:** each reference is tried at its registry's mirrors, then at the registry itself
  (:func:`~sandrl.images.reference.endpoints`); a manifest found at one endpoint has its blobs
  fetched from the same one first.
- **Auth:** a ``401`` challenge is answered as Docker does: ``Bearer`` → a token from the
  challenge's realm (anonymous, or with the credential of ``config.json``), ``Basic`` → the
  credential itself. Tokens are kept per endpoint and scope.
- **Elsewhere:** a redirect (at most :data:`~sandrl.images.destinations.MAX_REDIRECTS`) and a
  token realm are followed only where :mod:`sandrl.images.destinations` admits them (the
  registry's own origin or host, its configured delegates, public https at a checked address);
  credentials go only to the registry's own token service. A redirect's target gets no
  ``Authorization`` and its ``401`` is not answered.
- **Checks:** every manifest and blob is hashed and compared with its digest (the one asked for,
  the index's, or the registry's ``Docker-Content-Digest``); a blob may not exceed the size its
  descriptor gives; a manifest is at most 4 MiB. Nothing unchecked is returned or kept.
- **Failures:** ``429`` and ``5xx`` answers and broken connections are retried with exponential
  backoff (``Retry-After`` honoured, bounded); a blob download that breaks resumes where it
  stopped (``Range``), and a partial file left by an interrupted pull is resumed by the next one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import itertools
import json
import os
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

from sandrl.errors import LayerError, RegistryError
from sandrl.images.credentials import Credential, DockerConfig
from sandrl.images.destinations import MAX_REDIRECTS, Destination, admit, may_get_credentials, origin_of
from sandrl.images.manifest import ACCEPT, MAX_MANIFEST_BYTES, Descriptor
from sandrl.images.reference import REGISTRIES_CONFIG, Mirrors, Reference, endpoints, is_loopback
from sandrl.retry import Backoff, retry

__all__ = ["FetchedManifest", "RegistryClient"]

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
_REDIRECT_STATUS = {301, 302, 303, 307, 308}
_MAX_TOKEN_ANSWER = 1 << 20
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')
_CHUNK = 1 << 20
MAX_RETRY_AFTER_S = 30.0


@dataclass(frozen=True)
class FetchedManifest:
    body: bytes
    media_type: str
    digest: str
    """``sha256:<hex>`` of ``body``, checked against what was asked for."""
    endpoint: str
    """The base URL that served it; its blobs are fetched there first."""


class _Attempt(Exception):
    """One endpoint's failure, kept for the message when every endpoint failed. Never leaves this
    module: the public methods turn it into a :class:`~sandrl.errors.RegistryError`."""

    def __init__(self, what: str, *, status: int | None = None, final: bool = False) -> None:
        super().__init__(what)
        self.status = status
        self.final = final
        """Asking this endpoint again cannot help (a refused redirect, a plain-http registry)."""


def _digest_of(body: bytes, algorithm: str = "sha256") -> str:
    return f"{algorithm}:{hashlib.new(algorithm, body).hexdigest()}"


class RegistryClient:
    """Fetches manifests and blobs; use as ``async with RegistryClient() as client``."""

    def __init__(
        self,
        *,
        mirrors: Mirrors | None = None,
        docker_config: DockerConfig | None = None,
        retries: int = 5,
        backoff_s: float = 0.5,
        timeout_s: float = 60.0,
        max_connections: int = 16,
        verify: ssl.SSLContext | None = None,
    ) -> None:
        """``verify``: the TLS trust for registries and what they send the client to (default:
        certifi's roots)."""
        self.mirrors = mirrors if mirrors is not None else Mirrors.from_environment()
        self.docker_config = docker_config if docker_config is not None else DockerConfig()
        self.retries = retries
        self.backoff = Backoff(backoff_s, max_s=8.0, jitter=(0.8, 1.2))
        """The waits between tries when no ``Retry-After`` says how long."""
        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 15.0))
        # Redirects are followed by hand (_follow), each hop admitted by sandrl.images.destinations.
        self._http = httpx.AsyncClient(
            timeout=timeout,
            follow_redirects=False,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            headers={"User-Agent": "sandrl"},
            trust_env=False,
            verify=verify if verify is not None else True,
        )
        # Public targets (a CDN, a token service on another host) are connected to by a checked
        # address; no connection is kept, so none made for one name is reused for another.
        self._pinned = httpx.AsyncClient(
            timeout=timeout,
            follow_redirects=False,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=0),
            headers={"User-Agent": "sandrl"},
            trust_env=False,
            verify=verify if verify is not None else True,
        )
        self._tokens: dict[tuple[str, str], str] = {}
        self._token_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._withheld: dict[tuple[str, str], str] = {}
        """(endpoint, scope) → the realm its credentials were not sent to (for the 401's message)."""

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._pinned.aclose()

    # -- manifests

    async def manifest(
        self, ref: Reference, *, digest: str | None = None, endpoint: str | None = None
    ) -> FetchedManifest:
        """The manifest (or index) of ``ref`` — or the one of ``digest`` in ``ref``'s repository —
        from the first endpoint that has it; checked against the digest asked for."""
        wanted = digest or ref.digest
        tried: list[str] = []
        order = endpoints(ref, self.mirrors)
        if endpoint is not None:
            order = [endpoint, *(e for e in order if e != endpoint)]
        for base in order:
            try:
                return await self._manifest_at(base, ref, digest or ref.manifest_ref, wanted)
            except _Attempt as exc:
                tried.append(f"{base} ({exc})")
        raise RegistryError(
            f"cannot get the manifest of {ref}: tried {'; '.join(tried)}. Check the name and tag; offline, point a "
            f"mirror that holds it at {ref.registry} (SANDRL_REGISTRY_MIRRORS={ref.registry}=http://HOST:PORT)"
        )

    async def _manifest_at(self, base: str, ref: Reference, name: str, wanted: str | None) -> FetchedManifest:
        url = f"{base}/v2/{ref.repository}/manifests/{name}"
        response = await self._send(base, ref, "GET", url, headers={"Accept": ACCEPT}, stream=True)
        try:
            body = await _read_bounded(response, MAX_MANIFEST_BYTES, f"the manifest of {ref}")
        except httpx.HTTPError as exc:
            raise _Attempt(f"the answer broke off ({_describe(exc)})") from exc
        finally:
            await response.aclose()
        algorithm = (wanted or "sha256:").split(":", 1)[0]
        actual = _digest_of(body, algorithm)
        claimed = response.headers.get("Docker-Content-Digest")
        if wanted is not None and actual != wanted:
            raise LayerError(f"the manifest {base} served for {ref} has the digest {actual}, not {wanted}: refused")
        if wanted is None and claimed and claimed.startswith("sha256:") and claimed != _digest_of(body):
            raise LayerError(f"the manifest {base} served for {ref} does not match its Docker-Content-Digest: refused")
        media = response.headers.get("Content-Type", "").split(";")[0].strip()
        return FetchedManifest(body=body, media_type=media, digest=wanted or _digest_of(body), endpoint=base)

    # -- blobs

    async def blob_bytes(self, ref: Reference, desc: Descriptor, endpoint: str, *, limit: int) -> bytes:
        """A small blob (an image config) in memory, checked."""
        if desc.size > limit:
            raise LayerError(f"{ref}: the blob {desc.digest} is {desc.size} bytes, over the bound of {limit}")
        url = f"{endpoint}/v2/{ref.repository}/blobs/{desc.digest}"

        async def fetch(_: int) -> bytes:
            response = await self._send(endpoint, ref, "GET", url, stream=True)
            try:
                return await _read_bounded(response, desc.size, f"the blob {desc.digest} of {ref}")
            finally:
                await response.aclose()

        try:
            # _send has retried what retrying can mend; a body that broke off is asked again here.
            body = await retry(fetch, attempts=self.retries + 1, backoff=self.backoff, retry_on=(httpx.HTTPError,))
        except (httpx.HTTPError, _Attempt) as exc:
            raise RegistryError(
                f"cannot get the blob {desc.digest} of {ref} from {endpoint}: {_describe_attempt(exc)}; "
                "check that the registry still has this image, then run the pull again"
            ) from exc
        algorithm = desc.digest.split(":", 1)[0]
        if _digest_of(body, algorithm) != desc.digest:
            raise LayerError(f"{ref}: the blob {desc.digest} from {endpoint} does not match its digest: refused")
        return body

    async def blob_to_file(
        self,
        ref: Reference,
        desc: Descriptor,
        endpoint: str,
        dest: Path,
        *,
        on_bytes: Callable[[int], None] | None = None,
    ) -> None:
        """Download a layer blob to ``dest``, checked. A ``dest.partial`` left by a broken download
        (this one's or an earlier pull's) is continued with a ``Range`` request."""
        partial = dest.with_name(dest.name + ".partial")
        algorithm = desc.digest.split(":", 1)[0]
        url = f"{endpoint}/v2/{ref.repository}/blobs/{desc.digest}"
        failures = 0
        while True:
            have = partial.stat().st_size if partial.exists() else 0
            if have > desc.size:
                partial.unlink()
                have = 0
            if have == desc.size:
                break
            headers = {"Range": f"bytes={have}-"} if have else {}
            try:
                response = await self._send(endpoint, ref, "GET", url, headers=headers, stream=True)
                try:
                    if have and response.status_code != 206:
                        have = 0  # the server ignored the Range: start over
                    with open(partial, "r+b" if have else "wb") as out:
                        out.seek(have)
                        out.truncate()
                        async for chunk in response.aiter_bytes(_CHUNK):
                            have += len(chunk)
                            if have > desc.size:
                                raise LayerError(
                                    f"{ref}: the blob {desc.digest} from {endpoint} is larger than the "
                                    f"{desc.size} bytes its manifest gives: refused"
                                )
                            out.write(chunk)
                            if on_bytes is not None:
                                on_bytes(len(chunk))
                finally:
                    await response.aclose()
            except (httpx.HTTPError, _Attempt) as exc:
                failures += 1
                if isinstance(exc, _Attempt) and exc.final:
                    raise RegistryError(f"downloading {desc.digest} of {ref} from {endpoint}: {exc}") from exc
                if failures > self.retries:
                    raise RegistryError(
                        f"downloading {desc.digest} of {ref} from {endpoint} failed {failures} times (last: "
                        f"{_describe_attempt(exc)}); run the pull again: it continues where it stopped"
                    ) from exc
                await asyncio.sleep(self.backoff.delay(failures))
                continue
            if have < desc.size:
                failures += 1  # the body ended early without an error: resume it
                if failures > self.retries:
                    raise RegistryError(f"{endpoint} keeps ending {desc.digest} of {ref} early; run the pull again")
        digest = await asyncio.to_thread(_file_digest, partial, algorithm)
        if digest != desc.digest:
            partial.unlink(missing_ok=True)
            raise LayerError(f"{ref}: the blob {desc.digest} from {endpoint} has the digest {digest}: refused")
        os.replace(partial, dest)

    # -- requests

    async def _send(
        self,
        base: str,
        ref: Reference,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        stream: bool = False,
    ) -> httpx.Response:
        """One request with auth, redirects and retries; a response of status 200/206, else :class:`_Attempt`."""
        if urlsplit(base).scheme == "http" and not (is_loopback(urlsplit(base).netloc) or self._is_mirror(base)):
            raise _Attempt("plain http is used only for loopback registries and mirrors named as http://", final=True)
        scope = f"repository:{ref.repository}:pull"
        what = "a " + url.rsplit("/", 2)[-2].removesuffix("s") if "/v2/" in url else "a request"
        attempt = 0
        authed = False
        while True:
            token = self._tokens.get((base, scope))
            try:
                response, served_by = await self._follow(base, method, url, headers or {}, token, what)
            except httpx.TransportError as exc:
                attempt += 1
                # No answer at all (no such host, refused) rarely changes in seconds: give up sooner.
                limit = min(self.retries, 2) if isinstance(exc, httpx.ConnectError) else self.retries
                if attempt > limit:
                    raise _Attempt(_describe(exc)) from exc
                await asyncio.sleep(self.backoff.delay(attempt))
                continue
            status = response.status_code
            if status in (200, 206):
                if not stream:
                    await response.aread()
                return response
            detail = await _error_detail(response)
            if status == 401 and origin_of(served_by.url) != origin_of(base):
                raise _Attempt(
                    f"401 from {served_by.url[:200]}, where {base} redirected it: a redirect's target is never sent "
                    "credentials",
                    status=status,
                    final=True,
                )
            if status == 401 and not authed:
                authed = True
                await self._authenticate(base, ref, scope, response.headers.get("WWW-Authenticate", ""), token)
                continue
            if status in _RETRY_STATUS:
                attempt += 1
                if attempt <= self.retries:
                    await asyncio.sleep(self._wait(attempt, response.headers.get("Retry-After")))
                    continue
            if status == 401:
                host = urlsplit(base).netloc
                withheld = self._withheld.get((base, scope))
                why = (
                    f"; sandrl sent no credentials to the token service {withheld[:200]}, which is not on {host}: "
                    f'if it is this registry\'s, name it in {REGISTRIES_CONFIG}: [delegates] "{base}" = '
                    f'["{urlsplit(withheld).scheme}://{urlsplit(withheld).netloc}"]'
                    if withheld
                    else ""
                )
                raise _Attempt(
                    f"401 unauthorized: {detail}; log in (docker login {host}) or check the credentials in "
                    f"{self.docker_config.path}{why}",
                    status=status,
                )
            raise _Attempt(f"{status} {detail}", status=status)

    async def _follow(
        self, base: str, method: str, url: str, headers: dict[str, str], token: str | None, what: str
    ) -> tuple[httpx.Response, Destination]:
        """``url``'s answer once redirects are followed, each hop admitted; and who gave it."""
        here = Destination(url, own=True)
        delegates = self.mirrors.delegates_of(base)
        for hops in itertools.count():
            sent = dict(headers)
            if token is not None and origin_of(here.url) == origin_of(base):
                sent["Authorization"] = token
            response = await self._request(here, method, sent)
            if response.status_code not in _REDIRECT_STATUS:
                return response, here
            location = response.headers.get("Location", "")
            await response.aclose()
            if not location:
                raise _Attempt(f"{response.status_code} from {here.url[:200]} without a Location", final=True)
            if hops >= MAX_REDIRECTS:
                raise _Attempt(
                    f"more than {MAX_REDIRECTS} redirects (the last to {location[:200]!r}): a loop, or a registry "
                    "to avoid",
                    final=True,
                )
            try:
                here = await admit(base, urljoin(here.url, location), kind="redirect", delegates=delegates, what=what)
            except RegistryError as exc:
                raise _Attempt(str(exc), final=True) from exc
        raise AssertionError("unreachable")

    async def _request(
        self,
        destination: Destination,
        method: str,
        headers: dict[str, str],
        *,
        params: dict[str, str] | None = None,
        data: dict[str, str] | None = None,
    ) -> httpx.Response:
        """One request to ``destination`` (its checked addresses in turn, if it has several), streamed."""
        client = self._http if destination.own else self._pinned
        *others, last = destination.requests(method, headers, params=params, data=data)
        for request in others:
            with contextlib.suppress(httpx.ConnectError):
                return await client.send(request, stream=True)
        return await client.send(last, stream=True)

    def _is_mirror(self, base: str) -> bool:
        return any(base in urls for urls in self.mirrors.table.values())

    def _wait(self, attempt: int, retry_after: str | None) -> float:
        """The wait before retry ``attempt``: the registry's ``Retry-After`` (bounded), else the backoff's."""
        if retry_after is not None:
            try:
                return min(max(float(retry_after), 0.0), MAX_RETRY_AFTER_S)
            except ValueError:
                pass
        return self.backoff.delay(attempt)

    async def _authenticate(self, base: str, ref: Reference, scope: str, challenge: str, stale: str | None) -> None:
        key = (base, scope)
        lock = self._token_locks.setdefault(key, asyncio.Lock())
        async with lock:
            if self._tokens.get(key) not in (None, stale):
                return  # another request of this pull got a token meanwhile
            host = urlsplit(base).netloc
            registry = ref.registry if base == endpoints(ref, Mirrors())[-1] else None  # a mirror has its own
            scheme, _, rest = challenge.partition(" ")
            params = dict(_CHALLENGE_PARAM.findall(rest))
            if scheme.lower() == "basic":
                cred = self.docker_config.lookup(registry or host)
                if cred is None:
                    raise _Attempt(
                        f"401: {host} wants a user name and password; add them to {self.docker_config.path} "
                        f"(docker login {host})",
                        status=401,
                    )
                pair = f"{cred.username}:{cred.password}".encode()
                self._tokens[key] = "Basic " + base64.b64encode(pair).decode()
                return
            if scheme.lower() != "bearer" or "realm" not in params:
                raise _Attempt(f"401 with a challenge sandrl does not know: {challenge[:200]!r}", status=401)
            realm = params["realm"]
            delegates = self.mirrors.delegates_of(base)
            try:
                destination = await admit(base, realm, kind="realm", delegates=delegates)
            except RegistryError as exc:
                raise _Attempt(str(exc), status=401, final=True) from exc
            cred = None
            if may_get_credentials(base, realm, registry=registry, delegates=delegates):
                cred = self.docker_config.lookup(registry or host)
            else:
                self._withheld[key] = realm
            self._tokens[key] = "Bearer " + await self._token(destination, params, scope, cred)

    async def _token(self, realm: Destination, params: dict[str, str], scope: str, cred: Credential | None) -> str:
        query = {"scope": params.get("scope", scope)}
        if "service" in params:
            query["service"] = params["service"]
        where = realm.url[:200]
        try:
            if cred is not None and cred.identity_token:
                form = {
                    "grant_type": "refresh_token",
                    "refresh_token": cred.identity_token,
                    "client_id": "sandrl",
                    **query,
                }
                response = await self._request(realm, "POST", {}, data=form)
            else:
                headers = {}
                if cred is not None:
                    pair = f"{cred.username}:{cred.password}".encode()
                    headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
                response = await self._request(realm, "GET", headers, params=query)
            try:
                body = await _read_bounded(response, _MAX_TOKEN_ANSWER, f"the token service {where}'s answer")
            finally:
                await response.aclose()
        except (httpx.HTTPError, LayerError) as exc:
            raise _Attempt(f"the token service {where} did not answer ({_describe(exc)})") from exc
        if response.status_code != 200:
            raise _Attempt(
                f"the token service {where} refused ({response.status_code}); check the credentials", status=401
            )
        try:
            data: Any = json.loads(body)
            token = data.get("token") or data.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise _Attempt(f"the token service {where} answered without a token")
        return token


async def _read_bounded(response: httpx.Response, limit: int, what: str) -> bytes:
    parts: list[bytes] = []
    total = 0
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > limit:
            raise LayerError(f"{what} is larger than {limit} bytes: refused")
        parts.append(chunk)
    return b"".join(parts)


async def _error_detail(response: httpx.Response) -> str:
    """The registry's own error code, short (``MANIFEST_UNKNOWN: manifest unknown``)."""
    try:
        body = await _read_bounded(response, 64 << 10, "an error answer")
    except (LayerError, httpx.HTTPError):  # the status says enough
        body = b""
    finally:
        await response.aclose()
    try:
        errors = json.loads(body).get("errors") or []
        first = errors[0]
        return f"{first.get('code', '')}: {first.get('message', '')}".strip(": ")
    except (ValueError, AttributeError, IndexError, TypeError):
        return response.reason_phrase or ""


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _describe_attempt(exc: BaseException) -> str:
    """An endpoint's failure as the user reads it: an attempt's own words, else the exception."""
    return str(exc) if isinstance(exc, _Attempt) else _describe(exc)


def _file_digest(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return f"{algorithm}:{h.hexdigest()}"
