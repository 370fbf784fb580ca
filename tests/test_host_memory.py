"""The one reader of /proc/meminfo: real values, and admission's shared reading."""

from __future__ import annotations

import pytest

from sandrl import host_memory


def test_meminfo_reads_the_hosts_real_values() -> None:
    total, available = host_memory.meminfo_kb("MemTotal"), host_memory.meminfo_kb("MemAvailable")
    assert total is not None and available is not None and 0 < available <= total
    assert host_memory.meminfo_kb("NoSuchField") is None


def test_a_reading_is_shared_within_its_age_and_fresh_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []

    def counted(key: str) -> int:
        reads.append(key)
        return 1000 + len(reads)

    monkeypatch.setattr(host_memory, "meminfo_kb", counted)
    first = host_memory.mem_available_bytes()
    assert first == 1001 * 1024 and len(reads) == 1
    assert host_memory.mem_available_bytes(max_age_s=60) == first and len(reads) == 1  # shared
    assert host_memory.mem_available_bytes() == 1002 * 1024 and len(reads) == 2  # 0: read now
    assert host_memory.mem_available_bytes(max_age_s=1e-9) == 1003 * 1024  # too old: read again


def test_readings_are_shared_by_key_and_age() -> None:
    reads: list[str] = []

    def reader(name: str) -> str:
        def read() -> str:
            reads.append(name)
            return f"{name}{len(reads)}"

        return read

    assert host_memory.recent("test-a", reader("a"), 60) == "a1"
    assert host_memory.recent("test-a", reader("a"), 60) == "a1"  # within its age: shared
    assert host_memory.recent("test-b", reader("b"), 60) == "b2"  # another key: its own reading
    assert host_memory.recent("test-a", reader("a")) == "a3"  # no age: read now
    assert host_memory.recent("test-a", reader("a"), 1e-9) == "a4"  # too old: read again
    assert reads == ["a", "b", "a", "a"]
