"""A short real RL run: the embedded engine samples, the trainer updates, the engine loads the new weights.

The tiny model is rewarded for the share of lowercase letters in four sampled tokens (about 10% at
random initialisation); a few dozen GRPO steps must raise the reward.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sandrl.inference.base import SamplingParams
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.model import build_tiny_model
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.train.batch import TrainSample, samples_from_groups
from sandrl.train.config import TrainConfig
from sandrl.train.losses import LossConfig
from sandrl.train.trainer import Trainer

LOWERCASE = frozenset(range(ord("a"), ord("z") + 1))
STEPS, GROUPS, GROUP_SIZE, TOKENS = 30, 4, 4, 4


async def test_a_few_dozen_grpo_steps_raise_the_reward(tmp_path: Path) -> None:
    policy, tokenizer = build_tiny_model(TinyModelConfig(seed=0))
    served, _ = build_tiny_model(TinyModelConfig(seed=0))
    trainer = Trainer(policy, TrainConfig(lr=3e-3, loss=LossConfig(loss_type="dapo")), tokenizer=tokenizer)
    engine = Engine(served, tokenizer, config=EngineConfig(seed=0, num_threads=1))
    prompt = tokenizer.encode_messages([{"role": "user", "content": "write letters"}], add_generation_prompt=True)
    rewards: list[float] = []
    try:
        for step in range(STEPS):
            params = [
                SamplingParams(max_new_tokens=TOKENS, ignore_eos=True, seed=step * 1000 + i)
                for i in range(GROUPS * GROUP_SIZE)
            ]
            generations = await asyncio.gather(*(engine.generate(prompt, p) for p in params))
            samples = [
                TrainSample(
                    token_ids=(*prompt, *gen.output_ids),
                    loss_mask=(0,) * len(prompt) + (1,) * len(gen.output_ids),
                    rollout_logprobs=(0.0,) * len(prompt) + tuple(gen.output_logprobs),
                    reward=sum(t in LOWERCASE for t in gen.output_ids) / len(gen.output_ids),
                    group_id=f"{step}-{i // GROUP_SIZE}",
                    weight_version=gen.weight_version,
                )
                for i, gen in enumerate(generations)
            ]
            groups = [samples[g : g + GROUP_SIZE] for g in range(0, len(samples), GROUP_SIZE)]
            metrics = trainer.step(samples_from_groups(groups))
            rewards.append(metrics["reward_mean"])
            # Sampled by the engine, recomputed by the trainer: the same policy, so the weights are ~1.
            assert metrics["staleness_max"] == 0.0
            if metrics["tokens"]:
                assert abs(metrics["is_weight_mean"] - 1.0) < 1e-3, metrics
            exported = trainer.export_weights(tmp_path / "weights")
            assert (
                await engine.update_weights_from_disk(str(exported.path), version=exported.version) == trainer.version
            )
    finally:
        await engine.aclose()
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.25, rewards
