"""The native helper is built once per source and compiler, with musl where the host has it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sandrl.errors import SandboxUnavailableError
from sandrl.sandbox.bwrap import helper_build


def _runs(binary: Path) -> None:
    proc = subprocess.run([str(binary)], capture_output=True, text=True)
    assert proc.returncode == 64 and "usage: sandrl-helper" in proc.stderr


@pytest.mark.skipif(shutil.which("musl-gcc") is None, reason="musl-gcc is not installed (Debian: musl-tools)")
def test_musl_is_preferred_and_the_build_is_cached(tmp_path: Path) -> None:
    built = helper_build.helper_path(tmp_path)
    assert built.parent.name.endswith("-musl")
    _runs(built)
    assert b"GLIBC" not in built.read_bytes()  # no glibc start-up (its cpuid probes) in the binary
    mtime = built.stat().st_mtime_ns
    assert helper_build.helper_path(tmp_path) == built and built.stat().st_mtime_ns == mtime


def test_without_musl_the_system_compiler_builds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_which = shutil.which
    monkeypatch.setattr(helper_build.shutil, "which", lambda name: None if name == "musl-gcc" else real_which(name))
    built = helper_build.helper_path(tmp_path)
    assert built.parent.name.endswith("-cc")
    _runs(built)


def test_no_compiler_at_all_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(helper_build.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailableError, match="C compiler"):
        helper_build.helper_path(tmp_path)
