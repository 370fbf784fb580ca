"""Running ``git`` on what a dataset registry names, which is hostile input.

A registry names repositories, commits and paths; git is run so that none of them can do more
than fetch objects over the network:

- the URL must be ``https://``, ``http://`` or ``git://`` to a plain host name (:func:`check_url`):
  ``ext::`` (runs a command), ``file://`` and bare paths (read this machine), ``fd::`` and ``ssh``
  (runs the user's ssh with their keys against a host the registry picks) are refused, and git
  is told the same (``GIT_ALLOW_PROTOCOL`` names the one scheme of the URL, and nothing for a
  command that works on the local copy only, so a missing object is never fetched behind our back);
- no prompt (``GIT_TERMINAL_PROMPT=0``), no hooks, no fsmonitor, no submodules, every received
  object checked (``transfer.fsckObjects``), no automatic gc in the cache;
- each command has a timeout (its whole process group is killed at it) and bounded output;
- what git prints is shown as one bounded line of printable text.

``http://`` and ``git://`` carry no authentication: a task pinned to a full commit id is still
what its registry named (git checks every object against its id), a branch or tag is not.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["GitFailed", "GitRunner", "check_url", "one_line", "repository_key"]

SCHEMES = ("https", "http", "git")
"""The transports a registry's ``git_url`` may use."""
MAX_URL_CHARS = 2048
MAX_OUTPUT_BYTES = 64 << 20
"""What one git command may print before it is stopped (an ``ls-tree`` of 100k files is ~10 MB)."""
REASON_CHARS = 300

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = re.compile(rf"^(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{{1,5}})?$")
_URL_PATH = re.compile(r"^/[A-Za-z0-9._~%!$&'()*+,;=:@/-]*$")
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]+")
_SPACE_OR_CONTROL = re.compile(r"[^\x21-\x7e]")

_HARDENING = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.symlinks=true",
    "transfer.fsckObjects=true",
    "fetch.recurseSubmodules=false",
    "submodule.recurse=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "advice.detachedHead=false",
    "http.lowSpeedLimit=1000",
    "http.lowSpeedTime=120",
)
"""``-c`` settings every command gets, over whatever the user's git config says."""
_REPOSITORY_ENV = frozenset(
    [
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_CONFIG",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
        "GIT_OBJECT_DIRECTORY",
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_IMPLICIT_WORK_TREE",
        "GIT_GRAFT_FILE",
        "GIT_INDEX_FILE",
        "GIT_NO_REPLACE_OBJECTS",
        "GIT_REPLACE_REF_BASE",
        "GIT_PREFIX",
        "GIT_INTERNAL_SUPER_PREFIX",
        "GIT_SHALLOW_FILE",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "GIT_QUARANTINE_PATH",
    ]
)
"""What ``git rev-parse --local-env-vars`` names (and two more): set when sandrl runs inside a git
command (a hook), they would point git at another repository. The user's own settings are kept."""


class GitFailed(Exception):
    """A git command exited non-zero or ran out of time; ``reason`` is one printable line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def one_line(text: str | bytes, limit: int = REASON_CHARS) -> str:
    """``text`` (git's output, a server's message: hostile) as one printable line of at most ``limit`` chars."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    flat = " ".join(_UNPRINTABLE.sub(" ", text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def check_url(url: object) -> str | None:
    """Why ``url`` is not fetched (``None`` when it is): see the module's docstring."""
    if not isinstance(url, str) or not url:
        return "has no git_url (a registry task must name the repository it is fetched from)"
    shown = one_line(url, 120)
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not url.startswith(f"{parts.scheme}://"):
        kind = "ext:: runs a command" if url.startswith("ext::") else f"transport {parts.scheme or 'local path'!r}"
        return f"git_url {shown!r} is refused: {kind}; only {', '.join(s + '://' for s in SCHEMES)} URLs are fetched"
    if len(url) > MAX_URL_CHARS or _SPACE_OR_CONTROL.search(url):
        return f"git_url {shown!r} is over {MAX_URL_CHARS} characters or holds spaces or control characters"
    if "@" in parts.netloc:
        return f"git_url {shown!r} is refused: it carries a user name or password"
    if not _HOST.match(parts.netloc):
        return f"git_url {shown!r} is refused: {one_line(parts.netloc, 80)!r} is not a host name"
    if not _URL_PATH.match(parts.path) or parts.path.strip("/") == "" or parts.query or parts.fragment:
        return f"git_url {shown!r} is refused: its path must be a plain repository path, without query or fragment"
    return None


def repository_key(url: str) -> str:
    """One spelling per repository: ``https://Host/org/repo.git/`` and ``https://host/org/repo`` alike."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    path = path.removesuffix(".git")
    return f"{parts.scheme}://{parts.netloc.lower()}{path}"


class GitRunner:
    """Runs git in one bare repository of the cache, hardened as the module says."""

    def __init__(self, git_dir: Path, url: str, timeout_s: float) -> None:
        self.git_dir = git_dir
        self.url = url
        self.timeout_s = timeout_s
        self.network_calls = 0
        """Commands run that may reach the network (``fetch``, ``ls-remote``): what a cached pull must not need."""

    def _env(self, *, network: bool) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _REPOSITORY_ENV}
        env.update(
            GIT_DIR=str(self.git_dir),
            GIT_TERMINAL_PROMPT="0",
            GIT_ASKPASS="/bin/false",
            SSH_ASKPASS="/bin/false",
            GIT_ALLOW_PROTOCOL=urlsplit(self.url).scheme if network else "",
            GIT_PROTOCOL_FROM_USER="0",
            LC_ALL="C",
        )
        return env

    def run(
        self, args: Sequence[str], *, network: bool = False, stdin: bytes | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``git ARGS``; ``network``: a command that talks to the repository's server (counted).

        Raises :class:`GitFailed` on a timeout, on output over :data:`MAX_OUTPUT_BYTES`, or (with
        ``check``) on a non-zero exit, with the end of what git printed as the reason.
        """
        if network:
            self.network_calls += 1
        argv = ["git"]
        for setting in _HARDENING:
            argv += ["-c", setting]
        argv += list(args)
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env(network=network),
            cwd=self.git_dir if self.git_dir.is_dir() else None,
            start_new_session=True,  # a timeout kills git's helpers (remote-https, index-pack) too
        )
        try:
            out, err = _communicate(process, stdin, self.timeout_s)
        except subprocess.TimeoutExpired:
            raise GitFailed(f"git {args[0]} ran over its {self.timeout_s:g} s timeout") from None
        except OverflowError:
            raise GitFailed(f"git {args[0]} printed over {MAX_OUTPUT_BYTES >> 20} MiB") from None
        done = subprocess.CompletedProcess(argv, process.returncode, out, err)
        if check and done.returncode != 0:
            raise GitFailed(one_line(err[-4000:]) or f"git {args[0]} exited {done.returncode}")
        return done

    def text(self, args: Sequence[str], **kwargs: object) -> str:
        """What ``git ARGS`` printed on stdout, decoded."""
        return self.run(args, **kwargs).stdout.decode("utf-8", "replace")  # type: ignore[arg-type]

    def cat_file(self) -> subprocess.Popen[bytes]:
        """``git cat-file --batch`` on the local copy only, for :func:`~sandrl.tasks.datasets.fetch.export_tree`."""
        argv = ["git"]
        for setting in _HARDENING:
            argv += ["-c", setting]
        return subprocess.Popen(
            [*argv, "cat-file", "--batch"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self._env(network=False),
            start_new_session=True,
        )


def _communicate(process: subprocess.Popen[bytes], stdin: bytes | None, timeout_s: float) -> tuple[bytes, bytes]:
    """``process.communicate`` with its stdout bounded by :data:`MAX_OUTPUT_BYTES` (``OverflowError``
    past it) and only the end of its stderr kept: a server decides how much git prints."""
    assert process.stdout is not None and process.stderr is not None
    deadline = time.monotonic() + timeout_s
    err = bytearray()

    def feed() -> None:
        assert process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            process.stdin.write(stdin or b"")
        with contextlib.suppress(BrokenPipeError):
            process.stdin.close()

    def drain() -> None:
        assert process.stderr is not None
        while chunk := os.read(process.stderr.fileno(), 65536):
            err.extend(chunk)
            del err[:-65536]

    threads = [threading.Thread(target=drain, daemon=True)]
    if stdin is not None:
        threads.append(threading.Thread(target=feed, daemon=True))
    for thread in threads:
        thread.start()
    out = bytearray()
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(process.args, timeout_s)
            if not selector.select(min(left, 1.0)):
                continue
            chunk = os.read(process.stdout.fileno(), 1 << 20)
            if not chunk:
                break
            out.extend(chunk)
            if len(out) > MAX_OUTPUT_BYTES:
                raise OverflowError
        process.wait(max(0.1, deadline - time.monotonic()))
    except BaseException:
        _kill_group(process)
        raise
    finally:
        selector.close()
        for thread in threads:
            thread.join(5)
        process.stdout.close()
        process.stderr.close()
    return bytes(out), bytes(err)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """End git and its helpers (remote-https, index-pack: one process group, not yet reaped); reaped."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()
