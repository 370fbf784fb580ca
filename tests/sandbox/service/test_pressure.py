"""Pressure stall readings (``/proc/pressure``): parsed as the kernel writes them, and shared by admission."""

from __future__ import annotations

from pathlib import Path

from sandrl.sandbox.service.metrics import pressure_avg10

PSI = (
    "some avg10={some:.2f} avg60=1.00 avg300=0.50 total=12345\nfull avg10={full:.2f} avg60=0.40 avg300=0.10 total=678\n"
)


def _write(root: Path, some: float, full: float) -> None:
    (root / "memory").write_text(PSI.format(some=some, full=full))


def test_avg10_of_each_kind_and_none_without_psi(tmp_path: Path) -> None:
    _write(tmp_path, 3.25, 1.5)
    assert pressure_avg10("memory", "some", tmp_path) == 3.25
    assert pressure_avg10("memory", "full", tmp_path) == 1.5
    assert pressure_avg10("io", "some", tmp_path) is None  # no such file: PSI off


def test_a_reading_is_shared_within_its_age_and_fresh_without_one(tmp_path: Path) -> None:
    _write(tmp_path, 0, 2.0)
    assert pressure_avg10("memory", "full", tmp_path, max_age_s=60) == 2.0
    _write(tmp_path, 0, 40.0)
    assert pressure_avg10("memory", "full", tmp_path, max_age_s=60) == 2.0  # shared
    assert pressure_avg10("memory", "full", tmp_path) == 40.0  # 0: read now
    _write(tmp_path, 0, 7.0)
    assert pressure_avg10("memory", "full", tmp_path, max_age_s=1e-9) == 7.0  # too old: read again


def test_the_hosts_own_reading_when_the_kernel_has_psi() -> None:
    value = pressure_avg10("memory", "some")
    assert value is None or 0.0 <= value <= 100.0
