"""Open an HTML page in headless Chromium: the DOM after load, and a screenshot."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install -y chromium)"
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
)
# Appended to a copy of the page: after load, record every image's decoded width in the DOM.
PROBE = """<script>window.addEventListener('load', () => { for (const img of document.images) {
  img.setAttribute('data-natural-width', String(img.naturalWidth)); } });</script>"""


def _run(args: list[str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory(prefix="sandrl-chromium-") as profile:
        return subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )


def dump_dom(page: Path) -> str:
    """The DOM after load, with ``data-natural-width`` on every ``<img>``."""
    probe = page.with_name(page.stem + ".probe.html")
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    proc = _run(["--virtual-time-budget=5000", "--dump-dom", probe.as_uri()])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def screenshot(page: Path, out: Path) -> bytes:
    proc = _run([f"--screenshot={out}", "--window-size=1400,2400", page.as_uri()])
    assert proc.returncode == 0 and out.exists(), proc.stderr[-2000:]
    return out.read_bytes()
