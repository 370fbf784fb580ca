"""A small image that runs, made from this host: its ``sh`` and a few tools with the libraries they load.

For tests and benchmarks of registry images, which must start real sandboxes on machines that
can download no base image: the rootfs (a few MB, found through ``ldd``) is laid out as a
usrmerge'd Debian (``/bin`` -> ``usr/bin``), and :func:`shell_layer` makes it an image layer.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from sandrl.errors import ConfigError
from sandrl.images.oci_layout import Compression, LayerSpec, tree_entries

TOOLS = (
    "sh",
    "bash",
    "cat",
    "ls",
    "stat",
    "tr",
    "sleep",
    "id",
    "mkdir",
    "rm",
    "echo",
    "test",
    "env",
    "touch",
    "grep",
    "head",
    "tar",
    "find",
    "chmod",
    "chown",
    "cp",
    "mv",
    "ln",
    "cut",
    "date",
    "dirname",
    "xargs",
    "setpriv",
)
_LIB = re.compile(r"(/\S+\.so[^\s]*)")


def _libraries(binary: str) -> set[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
    return set(_LIB.findall(out))


def shell_rootfs(root: Path) -> Path:
    """A rootfs under ``root`` with :data:`TOOLS` in ``/usr/bin`` and their libraries."""
    if root.exists():
        return root
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for d in ("usr/bin", "etc", "tmp", "root", "var/log", "run", "proc", "dev", "sys"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    os.chmod(tmp / "tmp", 0o1777)
    libs: set[str] = set()
    for tool in TOOLS:
        found = shutil.which(tool)
        if found is None:
            raise ConfigError(f"this host has no {tool}, which the small image is made of; install it")
        real = os.path.realpath(found)
        shutil.copy2(real, tmp / "usr/bin" / tool)
        libs |= _libraries(real)
    for lib in libs:
        real = os.path.realpath(lib)
        for name in {lib, real}:
            target = tmp / name.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                shutil.copy2(real, target)
    for link in ("bin", "lib", "lib64", "sbin"):
        if (tmp / link).exists() and not (tmp / link).is_symlink():
            # ldd named /lib64/ld-linux...: move it under usr/, as a usrmerge'd system has it
            for item in (tmp / link).rglob("*"):
                if item.is_file():
                    dest = tmp / "usr" / link / item.relative_to(tmp / link)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(item), dest)
            shutil.rmtree(tmp / link)
        if (tmp / "usr" / link).exists() or link in ("bin", "sbin"):
            (tmp / "usr" / link).mkdir(parents=True, exist_ok=True)
            os.symlink(f"usr/{link}", tmp / link)
    (tmp / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n")
    (tmp / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
    tmp.rename(root)
    return root


def shell_layer(root: Path, compression: Compression = "gzip") -> LayerSpec:
    return LayerSpec(tree_entries(shell_rootfs(root)), compression=compression)
