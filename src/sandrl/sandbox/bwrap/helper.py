"""The native helper binary (``native/sandrl-helper.c``): built on first use, cached by hash.

It is compiled static so the same binary runs as the agent inside any image, whatever
C library (or none) the image has. Building needs a C compiler and the static C library
(Debian: ``gcc`` and ``libc6-dev``); ``scripts/bootstrap.sh`` installs both.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path

from sandrl.errors import SandboxUnavailableError

SOURCE_NAME = "sandrl-helper.c"


def _source() -> bytes:
    return resources.files("sandrl.sandbox.bwrap.native").joinpath(SOURCE_NAME).read_bytes()


def helper_path(cache_dir: Path) -> Path:
    """Return the path of a built helper for the current source, building it if needed."""
    source = _source()
    digest = hashlib.sha256(source).hexdigest()[:16]
    target = cache_dir / digest / "sandrl-helper"
    if target.exists():
        return target
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise SandboxUnavailableError(
            "sandrl needs a C compiler to build its sandbox helper once; install one "
            "(Debian: apt-get install gcc libc6-dev) or run scripts/bootstrap.sh"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(cache_dir, 0o755)
    os.chmod(target.parent, 0o755)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two processes building at once: one builds, one waits
        if target.exists():
            return target
        src = target.parent / SOURCE_NAME
        src.write_bytes(source)
        tmp = target.with_suffix(".tmp")
        proc = subprocess.run(
            [compiler, "-O2", "-static", "-Wall", "-o", str(tmp), str(src)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            detail = proc.stderr.strip().splitlines()[-3:]
            raise SandboxUnavailableError(
                "building the sandbox helper failed (a static C library is needed: "
                f"Debian: apt-get install libc6-dev): {' / '.join(detail)}"
            )
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    return target
