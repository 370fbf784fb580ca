"""A trainer step leaves resident only what it still uses: the activations it freed go back to the kernel.

Without that, glibc keeps a step's freed activations in the trainer thread's arena: the demo's
driver held ~800 MiB free between steps, and its resident set grew from 1.7 to 2.7 GB over 80 steps
as the batches' shapes left holes (issue #45).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandrl.host_memory import process_memory_bytes, release_freed_memory
from sandrl.train.batch import Batch
from sandrl.train.config import TrainConfig

from .helpers import make_trainer, sample

MIB = 2**20


def _rss() -> tuple[int, int]:
    memory = process_memory_bytes()
    if memory is None:
        pytest.skip("this host has no /proc/self/status")
    return memory


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def test_a_steps_freed_activations_are_not_left_resident() -> None:
    # 40 samples of ~420 tokens, one micro-batch: its activations are ~100 MiB of tensors each under
    # glibc's mmap threshold once the first step has raised it.
    trainer = make_trainer(TrainConfig(lr=1e-3, micro_batch_tokens=16384))
    batch = Batch.of([sample(f"task {i}", "x" * 400, advantage=1.0 if i % 2 else -1.0) for i in range(40)])
    trainer.step(batch)  # the optimizer's state, kernels loaded on first use
    release_freed_memory()
    before = _rss()[0]
    _reset_peak()
    trainer.step(batch)
    after, peak = _rss()
    held = peak - before
    assert held > 40 * MIB, f"the step held only {held / MIB:.0f} MiB: too little to tell a leak"
    assert after - before < held / 4, (
        f"the step held {held / MIB:.0f} MiB at its peak and {(after - before) / MIB:.0f} MiB of it is still "
        "resident after it"
    )
