"""``sandrl bench train --scale``: every row measured on a small model, one JSON line, the exit status its verdict."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from sandrl.bench.tensor_peak import TensorPeak
from sandrl.bench.train_scale import QUICK, TARGETS, logprob_peak
from sandrl.cli import app
from sandrl.errors import ConfigError


def test_quick_scale_run_measures_every_row_and_exits_by_its_targets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the processes it starts
    r = CliRunner().invoke(app, ["bench", "train", "--scale", "--quick", "--json"])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.output
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.output
    result = json.loads(lines[0])
    assert r.exit_code == (0 if result["met"] else 1)
    assert result["bench"] == "train_scale" and result["model"]["parameters"] > 1_000_000
    assert result["met"] == all(result[row]["met"] for row in TARGETS)
    for row in ("ranks", "lora", "bf16", "logprobs"):
        assert 0 < result[row]["ratio"] <= 1, (row, result[row])
        assert result[row]["target"] == TARGETS[row]
    ranks = result["ranks"]
    assert ranks["ranks"] == 2 and len(ranks["per_rank_bytes"]) == 2 and min(ranks["per_rank_bytes"]) > 0
    assert ranks["ratio"] == pytest.approx(max(ranks["per_rank_bytes"]) / ranks["alone_bytes"], abs=1e-3)
    lora = result["lora"]
    assert 0 < lora["lora_trainable"] < lora["full_trainable"] == result["model"]["parameters"]
    assert result["bf16"]["bf16_dtypes"] == ["bfloat16"]
    packing = result["packing"]
    assert packing["episodes"] == QUICK.demo_tasks and packing["micro_batch_tokens"] == 4096, "the demo's budget"
    assert 0 <= packing["packed_waste"] <= packing["packed_masked_waste"] <= packing["padded_waste"] < 1
    assert packing["packed_attention"] == "sandrl_packed"
    logprobs = result["logprobs"]
    assert logprobs["chunked_bytes"] < logprobs["full_bytes"] and logprobs["logits_bytes"] < logprobs["full_bytes"]
    assert not list(tmp_path.glob("sandrl-*")), "the bench leaves no model, task or store behind"


def test_counting_meta_tensors_gives_the_peak_of_real_ones() -> None:
    small = replace(QUICK, logprob_tokens=256, logprob_vocab=2048, logprob_chunk_tokens=64)
    for chunked in (True, False):
        assert logprob_peak(small, chunked=chunked) == logprob_peak(small, chunked=chunked, device="cpu")
    with TensorPeak() as peak:
        a = torch.ones(1000)  # 4000 bytes
        b = a * 2  # 8000 alive
        del a
        c = b.view(10, 100) + 1  # 8000: a was freed
        del b, c
        d = torch.ones(10)
    assert (peak.peak, peak.live) == (8000, 40)
    del d
    assert peak.live == 0


def test_scale_refuses_the_options_of_the_async_bench() -> None:
    r = CliRunner().invoke(app, ["bench", "train", "--scale", "--steps", "3", "--sigma", "1"])
    assert isinstance(r.exception, ConfigError), r.output
    assert "--scale takes only --quick and --json; --steps, --sigma belong" in str(r.exception)
