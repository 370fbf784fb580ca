"""Fixtures of the trainer tests: one intra-op thread (the box is shared), the tiny model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: small matrices gain nothing from more, and other test runs share the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
