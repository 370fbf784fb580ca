"""``sandrl bench inference --prefix-cache``: what the embedded engine's prefix cache saves on multi-turn episodes.

The same episodes run twice, on two engines of the same weights: one without the prefix cache
(``prefix_cache_tokens = 0``: every turn prefills its whole history, as before the cache), one with
it. An episode is the demo's (a ``lines`` task's instruction under the demo's system prompt, replies
of up to 80 tokens, all episodes at once) carried on for ``turns`` turns: after each reply the
agent's observation of a command (exit code and the task's file as stdout) is appended, token-exact
as the LLM agent appends it (:class:`~sandrl.inference.chat.ChatFormat`). The demo's policy runs one
turn, so the multi-turn episodes are this benchmark's; its model has the demo's shape, with a
context long enough for the turns.

Measured: the prompt tokens each engine's prefills computed, per episode; the ratio (target
<= 0.5); the cached share of the prompt tokens; how many turns have the same tokens on both engines
(target: all) and the largest log-prob gap between them (the tolerance of batching, 1e-4); each
side's wall time. Prints a card, returns the JSON line's dict.

Replies are greedy by default: at temperature 1 the engine's own batching already changes a few
sampled turns between two runs (2 of 128 with the cache off on both sides, measured): which rows
share a forward moves logits by about 1e-7, and a seeded draw near a boundary of the sorted
distribution of a random model (almost flat) then picks a neighbour of about the same probability.
A greedy reply changes only if such a difference changes which token is the most likely.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

from sandrl.errors import ConfigError
from sandrl.inference.base import Generation, InferenceClient, SamplingParams
from sandrl.inference.chat import ChatFormat
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.model import build_tiny_model
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.tasks.builtin.generated import make_task

SYSTEM_PROMPT = "Solve the task in a Linux shell. Reply with one command in a ```bash block."
"""The demo's system prompt (``sandrl.demo.learn``, which a benchmark may not import)."""
DEMO_MODEL = TinyModelConfig(hidden_size=128, num_layers=4, intermediate_size=256, max_position_embeddings=2048)
"""The demo's model (its warm start's shape), with room for four turns (the demo's context is 512 tokens)."""
TARGET_RATIO = 0.5
LOGPROB_TOLERANCE = 1e-4


@dataclass(frozen=True)
class PrefixBenchConfig:
    episodes: int = 32
    """Episodes at once (the demo's concurrency)."""
    turns: int = 4
    max_new_tokens: int = 80
    """Per reply: the demo's."""
    observation_bytes: int = 160
    """Most bytes of stdout an observation shows (of the task's input file)."""
    temperature: float = 0.0
    """Of the replies (the module's docstring says why greedy)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.episodes, self.turns, self.max_new_tokens, self.observation_bytes) < 1:
            raise ConfigError("episodes, turns, max_new_tokens and observation_bytes must be at least 1")

    @classmethod
    def quick(cls) -> PrefixBenchConfig:
        """A run of seconds: 4 episodes of 4 turns, shorter replies."""
        return cls(episodes=4, max_new_tokens=16)


@dataclass(frozen=True)
class _Side:
    prefill_tokens: int
    cached_tokens: int
    prompt_tokens: int
    wall_s: float
    turns: list[list[Generation]]


def run(config: PrefixBenchConfig) -> dict[str, Any]:
    """Both sides on fresh engines of the same weights; the JSON line's dict."""
    off = _side(config, 0)
    on = _side(config, EngineConfig().prefix_cache_tokens)
    pairs = [(a, b) for ea, eb in zip(off.turns, on.turns, strict=True) for a, b in zip(ea, eb, strict=True)]
    same = [(a, b) for a, b in pairs if a.output_ids == b.output_ids]
    gaps = (abs(x - y) for a, b in same for x, y in zip(a.output_logprobs, b.output_logprobs, strict=True))
    gap = max(gaps, default=0.0)
    ratio = on.prefill_tokens / off.prefill_tokens
    return {
        "bench": "inference_prefix_cache",
        "episodes": config.episodes,
        "turns_per_episode": config.turns,
        "max_new_tokens": config.max_new_tokens,
        "temperature": config.temperature,
        "model": f"tiny {DEMO_MODEL.hidden_size}x{DEMO_MODEL.num_layers}",
        "prompt_tokens_per_episode": round(off.prompt_tokens / config.episodes, 1),
        "prefill_tokens_per_episode_off": round(off.prefill_tokens / config.episodes, 1),
        "prefill_tokens_per_episode_on": round(on.prefill_tokens / config.episodes, 1),
        "prefill_ratio": round(ratio, 4),
        "target_ratio": TARGET_RATIO,
        "cached_share": round(on.cached_tokens / on.prompt_tokens, 4),
        "turns_identical": len(same),
        "turns": len(pairs),
        "max_logprob_gap": gap,
        "wall_s_off": round(off.wall_s, 3),
        "wall_s_on": round(on.wall_s, 3),
        "passed": len(same) == len(pairs) and gap < LOGPROB_TOLERANCE and ratio <= TARGET_RATIO,
    }


def render_card(result: dict[str, Any]) -> str:
    verdict = "pass" if result["passed"] else "FAIL"
    return "\n".join(
        [
            f"prefix cache: {result['episodes']} episodes x {result['turns_per_episode']} turns, replies of up to "
            f"{result['max_new_tokens']} tokens at temperature {result['temperature']:g}, {result['model']}",
            f"  prompt tokens per episode          {result['prompt_tokens_per_episode']:>10.1f}",
            f"  prefilled per episode, cache off   {result['prefill_tokens_per_episode_off']:>10.1f}"
            f"   ({result['wall_s_off']:.2f} s)",
            f"  prefilled per episode, cache on    {result['prefill_tokens_per_episode_on']:>10.1f}"
            f"   ({result['wall_s_on']:.2f} s)",
            f"  ratio on / off                     {result['prefill_ratio']:>10.3f}"
            f"   (target <= {result['target_ratio']})",
            f"  cached share of prompt tokens      {result['cached_share']:>10.3f}",
            f"  turns identical                    {result['turns_identical']:>5} of {result['turns']:<4}"
            f"(largest log-prob gap {result['max_logprob_gap']:.1e})",
            f"  verdict                            {verdict:>10}",
        ]
    )


def _side(config: PrefixBenchConfig, cache_tokens: int) -> _Side:
    net, tokenizer = build_tiny_model(DEMO_MODEL)
    engine = Engine(net, tokenizer, config=EngineConfig(seed=config.seed, prefix_cache_tokens=cache_tokens))
    try:
        chat = ChatFormat(tokenizer)
        started = time.perf_counter()
        turns = asyncio.run(_episodes(engine, chat, config))
        wall = time.perf_counter() - started
        prompt_tokens = sum(g.prompt_tokens for episode in turns for g in episode)
        return _Side(engine.stats.prefill_tokens, engine.stats.cached_tokens, prompt_tokens, wall, turns)
    finally:
        engine.close()


async def _episodes(engine: Engine, chat: ChatFormat, config: PrefixBenchConfig) -> list[list[Generation]]:
    return list(await asyncio.gather(*(episode(engine, chat, config, i) for i in range(config.episodes))))


async def episode(client: InferenceClient, chat: ChatFormat, config: PrefixBenchConfig, index: int) -> list[Generation]:
    """Episode ``index`` of ``config`` sampled from ``client`` (an engine in process, or a fleet's router: the
    same episodes for ``sandrl bench inference --fleet``); its turns' generations."""
    task = make_task("lines", random.Random(f"{config.seed}:{index}"), f"lines-{index}")
    stdout = next(iter(task.files.values()), "")[: config.observation_bytes]
    ids = chat.prompt_ids([{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.instruction}])
    turns: list[Generation] = []
    for turn in range(config.turns):
        seed = config.seed * 1_000_003 + index * 97 + turn
        params = SamplingParams(temperature=config.temperature, max_new_tokens=config.max_new_tokens, seed=seed)
        generation = await client.generate(ids, params)
        turns.append(generation)
        observation = {"role": "tool", "content": f"exit code: {turn % 2}\nstdout:\n{stdout}"}
        reply = {"role": "assistant", "content": chat.reply_text(generation.output_ids)}
        ids = ids + generation.output_ids + chat.append_ids(generation.output_ids, reply, [observation])
    return turns
