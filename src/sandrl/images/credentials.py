"""Registry credentials from Docker's own ``config.json``, as ``docker login`` writes it.

``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json``: an ``auths`` entry per registry
(``auth`` is base64 ``user:password``, or ``username``/``password``; ``identitytoken`` is an
OAuth refresh token), and credential helpers (``credHelpers`` per registry, ``credsStore`` for
all) run as ``docker-credential-<name> get`` with the server's name on stdin. Entries are matched
by host: ``https://index.docker.io/v1/`` is Docker Hub's key, as Docker writes it.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from sandrl.errors import ConfigError

__all__ = ["Credential", "DockerConfig"]

_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io", "registry-1.docker.io")
_HELPER_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Credential:
    username: str
    password: str
    identity_token: str | None = None
    """An OAuth2 refresh token (``identitytoken``), used in the token flow instead of the password."""


def _host_of(key: str) -> str:
    if "://" in key:
        return (urlsplit(key).netloc or key).lower()
    return key.split("/", 1)[0].lower()


class DockerConfig:
    """The credentials of one ``config.json`` (an absent file has none)."""

    def __init__(self, path: Path | None = None) -> None:
        if path is None:
            base = os.environ.get("DOCKER_CONFIG")
            path = (Path(base) if base else Path.home() / ".docker") / "config.json"
        self.path = path
        self._data: dict[str, object] = {}
        if path.is_file():
            try:
                loaded = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ConfigError(f"{path}: cannot read Docker's config ({exc}); fix or remove it") from exc
            if not isinstance(loaded, dict):
                raise ConfigError(f"{path}: Docker's config must be a JSON object")
            self._data = loaded

    def _section(self, name: str) -> dict[str, object]:
        value = self._data.get(name)
        return value if isinstance(value, dict) else {}

    def lookup(self, host: str) -> Credential | None:
        """The credential for the registry ``host`` (e.g. ``ghcr.io``, ``docker.io``, ``127.0.0.1:5000``)."""
        host = host.lower()
        keys = _HUB_KEYS if host in ("docker.io", "index.docker.io", "registry-1.docker.io") else (host,)
        helpers = self._section("credHelpers")
        for key in keys:
            helper = helpers.get(key)
            if isinstance(helper, str):
                return self._from_helper(helper, key)
        auths = self._section("auths")
        wanted = {_host_of(k) for k in keys}
        for key, entry in auths.items():
            if _host_of(key) in wanted and isinstance(entry, dict):
                found = self._from_entry(key, entry)
                if found is not None:
                    return found
        store = self._data.get("credsStore")
        if isinstance(store, str) and store:
            return self._from_helper(store, keys[0])
        return None

    def _from_entry(self, key: str, entry: dict[str, object]) -> Credential | None:
        token = entry.get("identitytoken")
        auth = entry.get("auth")
        user, password = entry.get("username"), entry.get("password")
        if isinstance(auth, str) and auth:
            try:
                user, _, password = base64.b64decode(auth, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError) as exc:
                raise ConfigError(f"{self.path}: auths.{key}.auth is not base64 of user:password ({exc})") from exc
        if isinstance(user, str) and isinstance(password, str) and (user or password):
            return Credential(user, password, token if isinstance(token, str) and token else None)
        if isinstance(token, str) and token:
            return Credential("<token>", "", token)
        return None

    def _from_helper(self, helper: str, server: str) -> Credential | None:
        program = shutil.which(f"docker-credential-{helper}")
        if program is None:
            raise ConfigError(
                f"{self.path} names the credential helper {helper!r}, but docker-credential-{helper} is not on "
                "PATH: install it, or put the registry's credentials in the file's auths"
            )
        try:
            proc = subprocess.run(
                [program, "get"], input=server, capture_output=True, text=True, timeout=_HELPER_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"the credential helper docker-credential-{helper} failed for {server}: {exc}") from exc
        if proc.returncode != 0:
            if "credentials not found" in (proc.stdout + proc.stderr).lower():
                return None
            raise ConfigError(
                f"the credential helper docker-credential-{helper} failed for {server} "
                f"(exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[:300]}"
            )
        try:
            data = json.loads(proc.stdout)
            user, secret = str(data["Username"]), str(data["Secret"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ConfigError(f"docker-credential-{helper} answered something that is not its JSON ({exc})") from exc
        if user == "<token>":
            return Credential(user, "", secret)
        return Credential(user, secret)
