"""Readings shared for a moment (sandrl.recent): by key, within their age."""

from __future__ import annotations

from sandrl.recent import recent


def test_readings_are_shared_by_key_and_age() -> None:
    reads: list[str] = []

    def reader(name: str) -> str:
        def read() -> str:
            reads.append(name)
            return f"{name}{len(reads)}"

        return read

    assert recent("test-a", reader("a"), 60) == "a1"
    assert recent("test-a", reader("a"), 60) == "a1"  # within its age: shared
    assert recent("test-b", reader("b"), 60) == "b2"  # another key: its own reading
    assert recent("test-a", reader("a")) == "a3"  # no age: read now
    assert recent("test-a", reader("a"), 1e-9) == "a4"  # too old: read again
    assert reads == ["a", "b", "a", "a"]
