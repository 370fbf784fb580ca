"""The native helper binary (``native/sandrl-helper.c``): built on first use, cached by hash.

It is compiled static so the same binary runs as the agent inside any image, whatever
C library (or none) the image has. It is linked against musl when ``musl-gcc`` is there
(Debian: ``musl-tools``, which ``scripts/bootstrap.sh`` installs), else against glibc with the
system compiler (``gcc`` and ``libc6-dev``).

Why musl: every sandbox starts the helper twice (the launcher, then pid 1), and a static glibc
binary probes the CPU's caches at start-up with ~90 ``cpuid`` instructions. Under a hypervisor
each one is a VM exit (7.5 us on the nested VMs sandrl is benchmarked on), so glibc's start-up
alone took ~0.66 ms per process there, against ~0.1 ms for a whole musl process start. The
sandbox's own programs (``/bin/sh`` for every command, bubblewrap) keep their own C library.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sysconfig
from importlib import resources
from pathlib import Path

from sandrl.errors import SandboxUnavailableError

SOURCE_NAME = "sandrl-helper.c"


def _source() -> bytes:
    return resources.files("sandrl.sandbox.bwrap.native").joinpath(SOURCE_NAME).read_bytes()


def _kernel_headers(cache_dir: Path) -> Path | None:
    """A directory holding only the kernel's uapi headers (``linux/``, ``asm/``, ``asm-generic/``),
    for musl-gcc, whose include path has musl's headers and not the kernel's; None if absent."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    sources = {
        "linux": Path("/usr/include/linux"),
        "asm-generic": Path("/usr/include/asm-generic"),
        "asm": Path("/usr/include") / multiarch / "asm",
    }
    if not all((src / "types.h").exists() for src in sources.values()):
        return None
    shim = cache_dir / "kernel-headers"
    shim.mkdir(parents=True, exist_ok=True)
    for name, src in sources.items():
        link = shim / name
        if not link.is_symlink() or os.readlink(link) != str(src):
            tmp = shim / f".{name}.tmp"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(src)
            os.replace(tmp, link)
    return shim


def _compilers(cache_dir: Path) -> list[tuple[str, list[str]]]:
    """The ways this host can build the helper, best first: (name, compiler command)."""
    found: list[tuple[str, list[str]]] = []
    musl = shutil.which("musl-gcc")
    headers = _kernel_headers(cache_dir) if musl else None
    if musl and headers:
        found.append(("musl", [musl, "-isystem", str(headers)]))
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc:
        found.append(("cc", [cc]))
    return found


def helper_path(cache_dir: Path) -> Path:
    """Return the path of a built helper for the current source, building it if needed."""
    source = _source()
    digest = hashlib.sha256(source).hexdigest()[:16]
    compilers = _compilers(cache_dir)
    for kind, _ in compilers:
        built = cache_dir / f"{digest}-{kind}" / "sandrl-helper"
        if built.exists():
            return built
    if not compilers:
        raise SandboxUnavailableError(
            "sandrl needs a C compiler to build its sandbox helper once; install one "
            "(Debian: apt-get install musl-tools, or gcc libc6-dev) or run scripts/bootstrap.sh"
        )
    failures = []
    for kind, command in compilers:
        target = cache_dir / f"{digest}-{kind}" / "sandrl-helper"
        failure = _build(source, command, target)
        if failure is None:
            return target
        failures.append(f"{kind}: {failure}")
    raise SandboxUnavailableError(
        "building the sandbox helper failed (a static C library is needed: Debian: apt-get install "
        f"musl-tools, or libc6-dev): {' / '.join(failures)}"
    )


def _build(source: bytes, command: list[str], target: Path) -> str | None:
    """Compile ``source`` to ``target`` (static); None on success, else the compiler's last words."""
    target.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(target.parent.parent, 0o755)
    os.chmod(target.parent, 0o755)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two processes building at once: one builds, one waits
        if target.exists():
            return None
        src = target.parent / SOURCE_NAME
        src.write_bytes(source)
        tmp = target.with_suffix(".tmp")
        proc = subprocess.run(
            [*command, "-O2", "-static", "-Wall", "-o", str(tmp), str(src)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            return " / ".join(proc.stderr.strip().splitlines()[-3:]) or f"exit {proc.returncode}"
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    return None
