"""New weights from a training step to every engine, by the disk and by broadcast: the time from the step's
end to the first token each engine samples at the new version (part of ``sandrl bench inference --fleet``).

On a fleet of launched engines (behind its router, as a run has them) and a trainer-side model of their
shape and weights, each push first moves every weight a little (what a step does, outside the timing),
then, from the step's end:

- **disk**: the model is written as the trainer exports it (:func:`~sandrl.inference.model.save_weights`
  into ``weights-v<version>``) and loaded through the router, which asks every engine to read it
  (``/update_weights_from_disk``);
- **broadcast**: :class:`~sandrl.inference.weight_push.WeightBroadcast` sends the tensors
  (:func:`~sandrl.inference.weight_push.model_weights`, as a one-process trainer does) to every engine at
  once, in buckets of ``[inference] weight_bucket_mb``, over the group a run forms with these engines
  (its backend chosen as a run chooses it: shared memory for engines on this host), formed once before
  the first push, as a run forms it (that time is reported apart);
- **gloo** (a reference, when the run's choice is another backend): the same broadcast over gloo, what
  engines on another host get;

then one call of one token per engine through the router (a routing key pinned to each engine), again
until the engine answers at the new version. The two ways alternate, ``pushes`` times each, so a
drift of the host's load reaches both; each way's p50 and all its samples are reported, with the
ratio of the p50s (target: broadcast <= 0.5x the disk) and the bytes each push moves.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch

from sandrl.errors import InferenceError
from sandrl.inference.base import SamplingParams
from sandrl.inference.fleet import affinity
from sandrl.inference.fleet.serve import Fleet
from sandrl.inference.model import save_weights
from sandrl.inference.sglang import SGLangClient
from sandrl.inference.tokenizer import Tokenizer
from sandrl.inference.transport import HTTPConfig
from sandrl.inference.weight_push import BroadcastSpec, WeightBroadcast, buckets, model_weights
from sandrl.stats import quantile

TARGET_RATIO = 0.5
PROBE = list(range(32, 48))
"""The prompt of the calls that wait for the new version (16 tokens: every update empties the prefix cache)."""
STEP = 1e-4
"""What each push adds to every weight: the step it carries (the amount does not change the cost)."""
WAIT_S = 120.0
"""Longest wait, after a push, for an engine to answer at the new version."""

Way = Literal["disk", "broadcast", "gloo"]


@dataclass(frozen=True)
class Push:
    way: Way
    version: int
    save_s: float
    """Writing the checkpoint (the disk only)."""
    update_s: float
    """Step end until the update call returned (saving included)."""
    first_token_s: float
    """Step end until every engine answered a call at the new version."""


async def measure(
    fleet: Fleet, model: Any, tokenizer: Tokenizer, workdir: Path, *, pushes: int, bucket_bytes: int, label: str
) -> dict[str, Any]:
    """Push ``model`` (the engines' model, moved a step before each push) ``pushes`` times each way; the
    result as a JSON-ready dict (``label`` names the model in it)."""
    http = HTTPConfig(api_key=fleet.token, retries=0)
    routed = SGLangClient(fleet.url, http=http)
    spec = BroadcastSpec(tuple(fleet.engine_urls), api_key=fleet.token, backend="", bucket_bytes=bucket_bytes)
    broadcast = WeightBroadcast(spec)
    ways: tuple[Way, ...] = ("disk", "broadcast") if broadcast.spec.backend == "gloo" else ("disk", "broadcast", "gloo")
    pushes_to: dict[Way, WeightBroadcast] = {
        "broadcast": broadcast,
        "gloo": WeightBroadcast(replace(spec, backend="gloo")),
    }
    keys = []
    for engine in fleet.router.engines:
        keys.append(f"bench/weights/{engine.index}")
        fleet.router.pin(keys[-1], engine)
    try:
        await _first_tokens(routed, keys, 0)  # connections open, engines warm
        started = time.perf_counter()
        await broadcast.connect()
        connect_s = time.perf_counter() - started
        if "gloo" in ways:
            await pushes_to["gloo"].connect()
        version = await routed.weight_version()
        samples: list[Push] = []
        checkpoint_bytes = 0
        for _ in range(pushes):
            for way in ways:
                version += 1
                _step(model)
                sample, directory = await _push(way, version, model, tokenizer, workdir, routed, pushes_to, keys)
                samples.append(sample)
                if directory is not None:
                    checkpoint_bytes = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
                    for old in workdir.glob("weights-v*"):  # the router replays the newest into a restarted engine
                        if old != directory:
                            shutil.rmtree(old, ignore_errors=True)
        pushed_bytes = broadcast.bytes_pushed // pushes
    finally:
        for push in pushes_to.values():
            await push.shutdown()
        await routed.aclose()
    disk = _way([s for s in samples if s.way == "disk"])
    sent = _way([s for s in samples if s.way == "broadcast"])
    ratio = sent["first_token_s_p50"] / disk["first_token_s_p50"]
    reference = {}
    if "gloo" in ways:
        gloo = _way([s for s in samples if s.way == "gloo"])
        reference = {"gloo": {**gloo, "ratio": round(gloo["first_token_s_p50"] / disk["first_token_s_p50"], 4)}}
    return {
        "model": label,
        "parameters": sum(p.numel() for p in model.parameters()),
        "engines": len(fleet.engine_urls),
        "pushes_per_way": pushes,
        "bucket_bytes": bucket_bytes,
        "buckets": sum(1 for _ in buckets(model_weights(model), bucket_bytes)),
        "group_connect_s": round(connect_s, 3),
        "disk": {**disk, "bytes_written": checkpoint_bytes, "bytes_read": checkpoint_bytes * len(fleet.engine_urls)},
        "broadcast": {**sent, "backend": broadcast.spec.backend, "bytes_sent": pushed_bytes},
        **reference,
        "ratio": round(ratio, 4),
        "target_ratio": TARGET_RATIO,
        "met": ratio <= TARGET_RATIO,
    }


async def _push(
    way: Way,
    version: int,
    model: Any,
    tokenizer: Tokenizer,
    workdir: Path,
    routed: SGLangClient,
    pushes_to: dict[Way, WeightBroadcast],
    keys: list[str],
) -> tuple[Push, Path | None]:
    directory: Path | None = None
    started = time.perf_counter()
    saved = started
    if way == "disk":
        directory = save_weights(model, workdir / f"weights-v{version:08d}", tokenizer)
        saved = time.perf_counter()
        await routed.update_weights(str(directory), version=version)
    else:
        await pushes_to[way].push(model_weights(model), version=version)
    updated = time.perf_counter()
    await _first_tokens(routed, keys, version)
    done = time.perf_counter()
    return Push(way, version, saved - started, updated - started, done - started), directory


async def _first_tokens(routed: SGLangClient, keys: list[str], version: int) -> None:
    """One token from each key's engine, asked again until it comes from weights ``version`` (or later)."""
    params = SamplingParams(temperature=0, max_new_tokens=1)
    deadline = time.monotonic() + WAIT_S

    async def probe(key: str) -> None:
        with affinity.bound(key):
            while (await routed.generate(PROBE, params)).weight_version < version:
                if time.monotonic() > deadline:
                    raise InferenceError(f"an engine (key {key}) still serves older weights than v{version}")
                await asyncio.sleep(0.01)

    await asyncio.gather(*(probe(key) for key in keys))


def _step(model: Any) -> None:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(STEP)


def _way(samples: list[Push]) -> dict[str, Any]:
    def p50(values: list[float]) -> float:
        return round(quantile(values, 0.5), 4)

    return {
        "first_token_s_p50": p50([s.first_token_s for s in samples]),
        "update_s_p50": p50([s.update_s for s in samples]),
        "save_s_p50": p50([s.save_s for s in samples]),
        "first_token_s": [round(s.first_token_s, 4) for s in samples],
    }
