"""``sandrl bench inference --fleet``: the four targets of inference at scale (#40), in one run.

1. **Reuse**: the prefix-cache benchmark's episodes (the demo's, over 4 turns:
   :func:`sandrl.bench.inference_prefix.episode`) through the router of 2 launched embedded engines of
   the demo's model, all at once, twice: with episode affinity (each episode's calls on one engine) and
   with the router going round the engines (``Router(affinity=False)``), each from empty prefix caches
   (``/flush_cache``). Measured: cached prompt tokens / prompt tokens, from the engines' answers
   (``meta_info.cached_tokens``); target >= 0.8 with affinity. Beside it, the *history share* of
   these episodes: the prompt tokens an episode's previous call had already seen (its prompt and reply),
   which is what keeping an episode on one engine can reuse at most (the rest of a prompt, the first
   turn's and each observation, is new to any engine).
2. **Router overhead** per call on the same fleet (:func:`sandrl.bench.router.measure`): target p50 <= 1 ms.
3. **Weight push**, step end to first token at the new version on both engines, disk against broadcast
   (:mod:`sandrl.bench.weight_push`), on 2 engines of a 104M-parameter Llama-shaped model (a second
   fleet): target broadcast <= 0.5x the disk.
4. **The embedded engine's prefix cache** on the demo's episodes, off against on, in process
   (:func:`sandrl.bench.inference_prefix.run`): prefill tokens per episode <= 0.5x, generations identical.

``--quick`` (a run of seconds, ``"quick": true`` in the JSON): 4 episodes with replies of 16 tokens, 10
router episodes, and the weights pushed twice each way to the demo's model on the first fleet.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from sandrl.bench import inference_prefix, router, weight_push
from sandrl.bench.inference_prefix import DEMO_MODEL, PrefixBenchConfig
from sandrl.errors import ConfigError
from sandrl.inference.base import Generation
from sandrl.inference.chat import ChatFormat
from sandrl.inference.fleet import affinity
from sandrl.inference.fleet.config import FleetConfig
from sandrl.inference.fleet.serve import Fleet, open_fleet
from sandrl.inference.model import build_tiny_model, save_weights
from sandrl.inference.sglang import SGLangClient
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.inference.transport import HTTPConfig, JSONTransport

TARGET_REUSE = 0.8
PUSH_MODEL = TinyModelConfig(hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4, intermediate_size=3072)
"""104M parameters, nearly all in the layers (the byte vocabulary's embedding is small)."""


@dataclass(frozen=True)
class FleetBenchConfig:
    episodes: PrefixBenchConfig = field(default_factory=PrefixBenchConfig)
    """The episodes of the reuse and prefix-cache measurements."""
    push_model: TinyModelConfig | None = PUSH_MODEL
    """The weight push's model; None: the demo's, on the reuse fleet (no second fleet to start)."""
    pushes: int = 5
    """Per way (disk, broadcast), alternating."""
    router_episodes: int = 100
    """Of 4 calls each, through the router and direct."""
    quick: bool = False
    """A run of seconds (:meth:`short`); said in the JSON."""

    def __post_init__(self) -> None:
        if min(self.pushes, self.router_episodes) < 1:
            raise ConfigError("pushes and router_episodes must be at least 1")

    @classmethod
    def short(cls) -> FleetBenchConfig:
        return cls(episodes=PrefixBenchConfig.quick(), push_model=None, pushes=2, router_episodes=10, quick=True)


def run(config: FleetBenchConfig, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Every measurement of the module docstring; the JSON line's dict."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sandrl-bench-fleet-") as work:
        reuse, overhead, push = asyncio.run(_on_fleets(config, Path(work), progress))
    progress("prefix cache: the demo's episodes in process, cache off then on")
    prefix = inference_prefix.run(config.episodes)
    met = {
        "reuse": reuse["affinity"]["cached_share"] >= TARGET_REUSE,
        "weight_push": bool(push["met"]),
        "router_overhead": bool(overhead["meets_target"]),
        "prefix_cache": bool(prefix["passed"]),
    }
    return {
        "bench": "inference_fleet",
        "quick": config.quick,
        "reuse": reuse,
        "weight_push": push,
        "router": overhead,
        "prefix_cache": prefix,
        "targets_met": met,
        "met": all(met.values()),
        "duration_s": round(time.perf_counter() - started, 1),
    }


async def _on_fleets(
    config: FleetBenchConfig, work: Path, progress: Callable[[str], None]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    fleet_config = FleetConfig(launch="embedded", engines=2, startup_timeout_s=300)
    bucket_bytes = fleet_config.weight_bucket_mb * 2**20
    demo, tokenizer = build_tiny_model(DEMO_MODEL)
    demo_label = f"tiny {DEMO_MODEL.hidden_size}x{DEMO_MODEL.num_layers}"
    progress(f"starting 2 embedded engines of the demo's model ({demo_label})")
    async with open_fleet(
        fleet_config, model=str(save_weights(demo, work / "demo", tokenizer)), log_dir=work / "engines-demo"
    ) as fleet:
        progress(f"reuse: {config.episodes.episodes} episodes of {config.episodes.turns} turns, affinity on")
        reuse: dict[str, Any] = {"affinity": await _reuse(fleet, tokenizer, config.episodes, keep_episodes=True)}
        progress("reuse: the same episodes, round the engines")
        reuse["round_robin"] = await _reuse(fleet, tokenizer, config.episodes, keep_episodes=False)
        reuse["target"] = TARGET_REUSE
        progress(f"router overhead: {config.router_episodes} episodes of 4 calls, routed and direct")
        overhead = await router.measure(fleet, demo_label, episodes=config.router_episodes, turns=4, max_new_tokens=1)
        if config.push_model is None:
            progress(f"weight push: {config.pushes} pushes each way, {demo_label}")
            push = await weight_push.measure(
                fleet, demo, tokenizer, work, pushes=config.pushes, bucket_bytes=bucket_bytes, label=demo_label
            )
            return reuse, overhead, push
    del demo
    shape = config.push_model
    net, tokenizer = build_tiny_model(shape)
    label = f"llama {shape.hidden_size}x{shape.num_layers}"
    checkpoint = save_weights(net, work / "push-model", tokenizer)
    progress(f"weight push: starting 2 embedded engines of {label} ({_millions(net)}M parameters)")
    async with open_fleet(fleet_config, model=str(checkpoint), log_dir=work / "engines-push") as fleet:
        progress(f"weight push: {config.pushes} pushes each way, alternating")
        push = await weight_push.measure(
            fleet, net, tokenizer, work, pushes=config.pushes, bucket_bytes=bucket_bytes, label=label
        )
    return reuse, overhead, push


async def _reuse(
    fleet: Fleet, tokenizer: ByteTokenizer, episodes: PrefixBenchConfig, *, keep_episodes: bool
) -> dict[str, Any]:
    """The episodes through the router, with each kept on one engine or not, from empty prefix caches."""
    http = HTTPConfig(api_key=fleet.token, retries=0)
    control = JSONTransport(fleet.url, http)
    client = SGLangClient(fleet.url, http=http)
    chat = ChatFormat(tokenizer)
    way = "affinity" if keep_episodes else "round-robin"
    fleet.router.affinity = keep_episodes
    before = [e.calls for e in fleet.router.engines]

    async def one(index: int) -> list[Generation]:
        with affinity.bound(f"bench/{way}/{index}"):
            return await inference_prefix.episode(client, chat, episodes, index)

    try:
        await control.send("POST", "/flush_cache")  # every engine's: the other way's sequences are not reused
        started = time.perf_counter()
        turns = await asyncio.gather(*(one(i) for i in range(episodes.episodes)))
        wall = time.perf_counter() - started
    finally:
        fleet.router.affinity = True
        await client.aclose()
        await control.aclose()
    prompt = sum(g.prompt_tokens for episode in turns for g in episode)
    cached = sum(g.cached_tokens for episode in turns for g in episode)
    seen = sum(a.prompt_tokens + len(a.output_ids) - 1 for episode in turns for a in episode[:-1])
    return {
        "episodes": episodes.episodes,
        "turns": episodes.turns,
        "max_new_tokens": episodes.max_new_tokens,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share": round(cached / prompt, 4),
        "history_share": round(seen / prompt, 4),
        "calls_per_engine": [e.calls - b for e, b in zip(fleet.router.engines, before, strict=True)],
        "wall_s": round(wall, 3),
    }


def run_with_card(*, quick: bool, seed: int, console: Console) -> dict[str, Any]:
    """``sandrl bench inference --fleet [--quick] [--seed N]``: the run, its progress and card on ``console``."""
    config = FleetBenchConfig.short() if quick else FleetBenchConfig()
    config = dataclasses.replace(config, episodes=dataclasses.replace(config.episodes, seed=seed))
    result = run(config, progress=lambda line: console.print(line, highlight=False))
    console.print(render_card(result))
    return result


def render_card(result: dict[str, Any]) -> Table:
    reuse, push, overhead, prefix = (result[k] for k in ("reuse", "weight_push", "router", "prefix_cache"))
    on, off = reuse["affinity"], reuse["round_robin"]
    disk, sent = push["disk"], push["broadcast"]
    table = Table(title=f"inference fleet: 2 launched embedded engines{' (quick run)' if result['quick'] else ''}")
    for name, justify in (("", "left"), ("measured", "right"), ("against", "right"), ("value", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    table.add_column("target", justify="right")
    table.add_column("met")
    met = result["targets_met"]
    rows: tuple[tuple[str, str, str, str, str, bool | None], ...] = (
        (
            f"prefix-cache reuse, cached / prompt tokens, affinity vs round-robin ({on['episodes']} episodes x "
            f"{on['turns']} turns; history share {on['history_share']:.3f})",
            f"{on['cached_share']:.3f}",
            f"{off['cached_share']:.3f}",
            f"{on['cached_share']:.3f}",
            f">= {reuse['target']}",
            met["reuse"],
        ),
        (
            f"weight push, step end -> first token on {push['engines']} engines, broadcast ({sent['backend']}) vs disk "
            f"({push['model']}, {push['parameters'] / 1e6:.1f}M parameters, {_size(sent['bytes_sent'])} a push)",
            f"{sent['first_token_s_p50']:.3f} s",
            f"{disk['first_token_s_p50']:.3f} s",
            f"{push['ratio']:.3f}x",
            f"<= {push['target_ratio']}x",
            met["weight_push"],
        ),
        (
            f"router overhead per call p50, routed vs direct ({overhead['calls']} calls each way)",
            f"{overhead['routed_ms_p50']:.3f} ms",
            f"{overhead['direct_ms_p50']:.3f} ms",
            f"{overhead['router_overhead_ms_p50']:.3f} ms",
            f"<= {overhead['target_overhead_ms']:g} ms",
            met["router_overhead"],
        ),
        (
            f"prefill tokens per episode, prefix cache on vs off ({prefix['turns_identical']} of "
            f"{prefix['turns']} turns identical)",
            f"{prefix['prefill_tokens_per_episode_on']:.1f}",
            f"{prefix['prefill_tokens_per_episode_off']:.1f}",
            f"{prefix['prefill_ratio']:.3f}x",
            f"<= {prefix['target_ratio']}x, same",
            met["prefix_cache"],
        ),
    )
    if "gloo" in push:  # what engines on another host would get: a reference, no target
        gloo = push["gloo"]
        reference = ("  the same over gloo (engines on another host)", f"{gloo['first_token_s_p50']:.3f} s")
        rows = (
            *rows[:2],
            (*reference, f"{disk['first_token_s_p50']:.3f} s", f"{gloo['ratio']:.3f}x", "-", None),
            *rows[2:],
        )
    for label, measured, against, value, target, ok in rows:
        shown = "-" if ok is None else "yes" if ok else "NO"
        table.add_row(*(Text(str(c)) for c in (label, measured, against, value, target, shown)))
    table.caption = (
        f"{'all targets met' if result['met'] else 'a target was missed'}; weight group formed in "
        f"{push['group_connect_s']:.2f} s (once a run); {result['duration_s']} s"
    )
    return table


def _millions(model: Any) -> str:
    return f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}"


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
