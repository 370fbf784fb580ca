"""A real OCI registry on loopback, for tests and benchmarks: Debian's ``docker-registry`` and ``skopeo``.

:class:`LocalRegistry` runs the CNCF distribution registry (``docker-registry serve``) on 127.0.0.1 at a
free port, with filesystem storage in a directory of the caller's, deletes enabled and, optionally,
htpasswd basic auth. :meth:`LocalRegistry.push` copies an OCI image layout into it with ``skopeo copy``.

The registry process must never outlive the Python process that started it: it is killed on
:meth:`~LocalRegistry.stop`, when the object is collected, at interpreter exit, and (when started from
the main thread) by the kernel if this process dies without running any of those.
"""

from __future__ import annotations

import base64
import functools
import json
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Literal

import bcrypt
import httpx

from sandrl.errors import ConfigError, RegistryError
from sandrl.processes import stop_process

REGISTRY_BINARY = "docker-registry"
SKOPEO_BINARY = "skopeo"
_ADDRESS_IN_USE = "address already in use"


def _require(binary: str, package: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise RegistryError(f"{binary} is not installed: apt-get install {package}")
    return path


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _kill(process: subprocess.Popen[bytes]) -> None:
    """Ends the registry: SIGTERM, then SIGKILL if it lingers. Safe to call twice and at interpreter exit."""
    stop_process(process, grace_s=5)


def htpasswd_line(user: str, password: str) -> str:
    """One htpasswd line; bcrypt is the only scheme the registry's htpasswd backend accepts ($2b$ and $2y$ alike)."""
    if not user or ":" in user or "\n" in user:
        raise ConfigError(f"{user!r} cannot be an htpasswd user name (empty, or has ':' or a newline)")
    # cost 5, the lowest: every request is checked against it, and these are throwaway test passwords.
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()
    return f"{user}:{hashed}"


class LocalRegistry:
    """The ``docker-registry`` binary on 127.0.0.1, storing under ``root`` (config, htpasswd and log beside).

    ``users`` (name -> password) turns on htpasswd basic auth; every request then needs one of them.
    ``port`` 0 picks a free one. Use as a context manager, or :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        root: Path,
        *,
        users: Mapping[str, str] | None = None,
        token: Mapping[str, str] | None = None,
        port: int = 0,
        start_timeout_s: float = 30.0,
        log_level: str = "warn",
    ) -> None:
        self.root = root.absolute()  # the registry runs in it: relative paths would resolve twice
        self.users: dict[str, str] = dict(users or {})
        self.token = dict(token) if token is not None else None
        """Bearer-token auth instead (``realm``, ``service``, ``issuer``, ``rootcertbundle``), as the
        distribution registry's ``auth.token`` section."""
        self.storage = self.root / "storage"
        self.log_path = self.root / "registry.log"
        self.config_path = self.root / "config.yml"
        self._want_port = port
        self._port = 0
        self._start_timeout_s = start_timeout_s
        self._log_level = log_level
        self._process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes]], LocalRegistry] | None = None

    @property
    def port(self) -> int:
        if self._process is None:
            raise RegistryError("the local registry is not running: start() it first")
        return self._port

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``, as image references name it."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    @property
    def credentials(self) -> tuple[str, str] | None:
        """The first user and its password, or None without auth."""
        return next(iter(self.users.items()), None)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _write_config(self, port: int) -> None:
        config: dict[str, object] = {
            "version": "0.1",
            "log": {"level": self._log_level, "formatter": "text", "accesslog": {"disabled": True}},
            "storage": {
                "filesystem": {"rootdirectory": str(self.storage)},
                "delete": {"enabled": True},
                # Blobs are served by the registry itself, never by a redirect elsewhere: a proxy in front sees them.
                "redirect": {"disable": True},
                "maintenance": {"uploadpurging": {"enabled": False}},
            },
            # A fixed secret: without one the registry makes a random one and warns at every start.
            "http": {"addr": f"127.0.0.1:{port}", "secret": secrets.token_hex(16)},
        }
        if self.token is not None:
            # Docker Hub's and ghcr.io's scheme: a 401 names a token service; its JWTs are signed by a
            # key whose certificate the registry trusts.
            config["auth"] = {"token": dict(self.token)}
        elif self.users:
            htpasswd = self.root / "htpasswd"
            htpasswd.write_text("".join(htpasswd_line(u, p) + "\n" for u, p in self.users.items()))
            config["auth"] = {"htpasswd": {"realm": "sandrl-test-registry", "path": str(htpasswd)}}
        # JSON is YAML: no YAML writer needed.
        self.config_path.write_text(json.dumps(config, indent=1))

    def start(self) -> LocalRegistry:
        if self._process is not None:
            return self
        binary = _require(REGISTRY_BINARY, "docker-registry")
        self.root.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(exist_ok=True)
        # A free port found by binding can be taken again before the registry binds it; a few tries cover that.
        attempts_left = 1 if self._want_port else 5
        while True:
            attempts_left -= 1
            self._port = self._want_port or _free_port()
            self._write_config(self._port)
            self._spawn(binary)
            try:
                self._wait_ready()
                return self
            except RegistryError:
                self.stop()
                if attempts_left == 0 or _ADDRESS_IN_USE not in _tail(self.log_path, 3):
                    raise

    def _spawn(self, binary: str) -> None:
        command = [binary, "serve", str(self.config_path)]
        setpriv = shutil.which("setpriv")
        # The kernel kills the registry when the thread that forked it ends, so the death signal is asked for
        # only from the main thread, whose end is the process's; from another thread it would die too soon.
        if setpriv is not None and threading.current_thread() is threading.main_thread():
            command = [setpriv, "--pdeathsig", "KILL", "--", *command]
        with self.log_path.open("ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting on 127.0.0.1:{self._port}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.root
            )
        self._finalizer = weakref.finalize(self, _kill, self._process)

    def _wait_ready(self) -> None:
        assert self._process is not None
        expected = 401 if self.users or self.token else 200
        deadline = time.monotonic() + self._start_timeout_s
        last = "no answer yet"
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while True:
                code = self._process.poll()
                if code is not None:
                    raise RegistryError(
                        f"docker-registry exited with status {code} before answering on {self.url}; "
                        f"its log ({self.log_path}) ends:\n{_tail(self.log_path)}"
                    )
                try:
                    status = client.get(f"{self.url}/v2/").status_code
                    if status == expected:
                        return
                    last = f"GET /v2/ answered {status}, not {expected}"
                except httpx.TransportError as e:
                    last = f"GET /v2/ failed: {e!r}"
                if time.monotonic() > deadline:
                    raise RegistryError(
                        f"docker-registry did not answer on {self.url} within {self._start_timeout_s:g} s ({last}); "
                        f"its log ({self.log_path}) ends:\n{_tail(self.log_path)}"
                    )
                time.sleep(0.05)

    def stop(self) -> None:
        """Ends the registry; its storage stays. Safe to call more than once."""
        if self._finalizer is not None:
            self._finalizer()  # runs _kill once, and no more at exit
            self._finalizer = None
        self._process = None

    def __enter__(self) -> LocalRegistry:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def push(
        self,
        layout: Path,
        ref: str,
        *,
        tag: str,
        all_platforms: bool = False,
        creds: tuple[str, str] | None = None,
        manifest_format: Literal["oci", "v2s2"] | None = None,
        timeout_s: float = 300.0,
    ) -> str:
        """Copies ``oci:<layout>:<tag>`` to ``<host>/<ref>`` with ``skopeo copy``; returns the pushed manifest's digest.

        ``ref`` is a repository (``test/base``: pushed as ``test/base:<tag>``) or ``repository:tag``.
        ``all_platforms`` copies a whole index (``--all``); without it skopeo copies this host's platform
        only. Digests are preserved (zstd layers stay zstd) unless ``manifest_format`` (``v2s2`` for
        Docker schema 2, ``oci``) asks skopeo to convert, which changes them. ``creds`` defaults to the
        registry's own first user.
        """
        skopeo = _require(SKOPEO_BINARY, "skopeo")
        if ":" in str(layout.resolve()):
            raise ConfigError(f"{layout}: skopeo cannot name an OCI layout whose path has a ':'")
        if not (layout / "index.json").is_file():
            raise ConfigError(f"{layout} is not an OCI image layout (no index.json)")
        repository, _, dest_tag = ref.partition(":")
        if not repository or repository != repository.lower() or repository.startswith("/"):
            raise ConfigError(f"{ref!r} is not a repository name (lower case, like test/base or test/base:tag)")
        creds = creds or self.credentials
        with tempfile.TemporaryDirectory(prefix="sandrl-push-") as tmp:
            digestfile = Path(tmp) / "digest"
            command = [skopeo, "--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false"]
            command += ["--digestfile", str(digestfile), "--tmpdir", tmp]
            if creds is not None:
                # An auth file, not --dest-creds: the password stays off command lines (ps, error messages).
                authfile = Path(tmp) / "auth.json"
                token = base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
                authfile.write_text(json.dumps({"auths": {self.host: {"auth": token}}}))
                command += ["--dest-authfile", str(authfile)]
            else:
                command += ["--dest-no-creds"]  # no stray auth.json on the host may change what is tested
            if all_platforms:
                command += ["--all"]
            if manifest_format is not None:
                command += ["--format", manifest_format]
            elif _skopeo_can_preserve_digests(skopeo):
                command += ["--preserve-digests"]
            command += [f"oci:{layout.resolve()}:{tag}", f"docker://{self.host}/{repository}:{dest_tag or tag}"]
            try:
                result = subprocess.run(command, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired as e:
                raise RegistryError(f"skopeo copy to {self.host}/{ref} did not finish within {timeout_s:g} s") from e
            if result.returncode != 0:
                stderr = "\n".join(result.stderr.decode(errors="replace").splitlines()[-15:])
                shown = " ".join(command)
                raise RegistryError(f"skopeo copy failed (status {result.returncode}): {shown}\n{stderr}")
            return digestfile.read_text().strip()


@functools.cache
def _skopeo_can_preserve_digests(skopeo: str) -> bool:
    """Older skopeo has no --preserve-digests; it then keeps digests anyway unless it must convert the manifest."""
    out = subprocess.run([skopeo, "copy", "--help"], capture_output=True, text=True, check=False)
    return "--preserve-digests" in out.stdout
