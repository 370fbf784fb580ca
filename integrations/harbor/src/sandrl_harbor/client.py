"""The few calls of sandrl's native sandbox API (``/v1``) a Harbor environment needs, over httpx.

This package runs in Harbor's own Python (>= 3.12), where sandrl itself is not installed, so it
speaks the HTTP API directly: create, get, delete, exec, a file up or down, a directory as a tar
stream up or down. An error answer keeps the server's ``error_code`` and ``message``
(:class:`SandrlAPIError`); a server that cannot be reached is retried briefly, then reported.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

API = "/v1"
CONNECT_RETRIES = 3


class SandrlAPIError(RuntimeError):
    """An error answer of the sandbox service, or no answer at all."""

    def __init__(self, message: str, *, error_code: str = "http_error", status: int = 0) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.status = status


class SandrlClient:
    """One sandbox service: ``url`` with its bearer ``token`` (None: a loopback server without one)."""

    def __init__(self, url: str, token: str | None, *, timeout_s: float = 120.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(base_url=self.url + API, headers=headers, timeout=timeout_s)

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        delay = 0.2
        for attempt in range(CONNECT_RETRIES + 1):
            try:
                response = await self._http.request(method, path, **kwargs)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt == CONNECT_RETRIES:
                    raise SandrlAPIError(
                        f"the sandrl sandbox service at {self.url} is not reachable ({exc}): start it with "
                        "`sandrl serve sandboxes`, or pass its URL (--ek url=http://host:8700)",
                        error_code="service_unreachable",
                    ) from exc
                await asyncio.sleep(delay)
                delay *= 2
                continue
            if response.status_code >= 400:
                raise _error(method, path, response)
            return response
        raise AssertionError("unreachable")

    async def create(self, spec: Mapping[str, Any], metadata: Mapping[str, str]) -> dict[str, Any]:
        r = await self.request("POST", "/sandboxes", json={**spec, "metadata": dict(metadata)})
        info: dict[str, Any] = r.json()
        return info

    async def get(self, sandbox_id: str) -> dict[str, Any]:
        info: dict[str, Any] = (await self.request("GET", f"/sandboxes/{sandbox_id}")).json()
        return info

    async def delete(self, sandbox_id: str) -> None:
        try:
            await self.request("DELETE", f"/sandboxes/{sandbox_id}")
        except SandrlAPIError as exc:
            if exc.status != 404:
                raise

    async def exec(
        self,
        sandbox_id: str,
        command: str,
        *,
        timeout_s: float,
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: bytes | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"command": command, "timeout_s": timeout_s}
        if cwd:
            body["cwd"] = cwd
        if env:
            body["env"] = dict(env)
        if stdin is not None:
            body["stdin_b64"] = base64.b64encode(stdin).decode()
        r = await self.request("POST", f"/sandboxes/{sandbox_id}/exec", json=body, timeout=timeout_s + 60)
        result: dict[str, Any] = r.json()
        return result

    async def put_file(self, sandbox_id: str, path: str, data: bytes, mode: int) -> None:
        params = {"path": path, "mode": f"{mode & 0o7777:o}"}
        headers = {"Content-Type": "application/octet-stream"}
        await self.request("PUT", f"/sandboxes/{sandbox_id}/files", params=params, content=data, headers=headers)

    async def get_file(self, sandbox_id: str, path: str) -> bytes:
        return (await self.request("GET", f"/sandboxes/{sandbox_id}/files", params={"path": path})).content

    async def put_tar(self, sandbox_id: str, directory: str, archive: bytes) -> None:
        """Unpack ``archive`` into ``directory`` (made if missing)."""
        headers = {"Content-Type": "application/x-tar"}
        params = {"path": directory}
        await self.request("PUT", f"/sandboxes/{sandbox_id}/tar", params=params, content=archive, headers=headers)

    async def get_tar(self, sandbox_id: str, directory: str) -> AsyncIterator[bytes]:
        """``directory`` as a tar stream (paths relative to it)."""
        request = self._http.build_request("GET", f"/sandboxes/{sandbox_id}/tar", params={"path": directory})
        response = await self._http.send(request, stream=True)
        try:
            if response.status_code >= 400:
                await response.aread()
                raise _error("GET", request.url.path, response)
            async for chunk in response.aiter_bytes():
                yield chunk
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()


def _error(method: str, path: str, response: httpx.Response) -> SandrlAPIError:
    error_code, message = "http_error", response.text[:500]
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error_code = str(body.get("error_code") or error_code)
        message = str(body.get("message") or message)
    return SandrlAPIError(
        f"{method} {path}: {message} ({error_code}, HTTP {response.status_code})",
        error_code=error_code,
        status=response.status_code,
    )
