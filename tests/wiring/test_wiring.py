"""The wiring layer: config tables to components, the same way for every caller."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from sandrl.errors import ConfigError
from sandrl.inference.broadcast_policy import BroadcastingPolicy
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.fleet.config import FleetConfig
from sandrl.inference.openai import OpenAIClient
from sandrl.inference.server import BackgroundServer, create_app
from sandrl.inference.sglang import SGLangClient
from sandrl.inference.tokenizer import ByteTokenizer, Tokenizer
from sandrl.rollout.agents.formats import FENCED_SYSTEM_PROMPT as SYSTEM_PROMPT
from sandrl.rollout.episode import EpisodeTimeouts
from sandrl.train.run_config import RolloutSection, load_run_config, save_resolved
from sandrl.wiring import ModelConfig, RolloutConfig, llm_agent, open_policy, runner_config
from sandrl.wiring.evaluate import EvalConfig


@dataclass
class _Policy:
    """Only what the wiring reads of a policy: its tokenizer and context length."""

    tokenizer: Tokenizer | None = None
    max_context: int | None = None


def test_rollout_timeouts_and_agent_limits_load_from_the_run_config_and_reach_the_runner(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(
        '[tasks]\nfamily = "echo"\n'
        "[rollout]\nwall_time_s = 90.0\nobservation_tokens = 256\ncommand_timeout_s = 20.0\n"
        "[rollout.timeouts]\nsetup_timeout_s = 30.0\nclose_timeout_s = 5.0\n"
    )
    config = load_run_config(path)
    assert config.rollout.timeouts == EpisodeTimeouts(setup_timeout_s=30.0, close_timeout_s=5.0)
    assert load_run_config(save_resolved(config, tmp_path / "saved.toml")) == config
    assert "[rollout.timeouts]" in (tmp_path / "saved.toml").read_text()
    runner = runner_config(config.rollout, run_id="r")
    assert runner.episode.timeouts.setup_timeout_s == 30.0 and runner.episode.budget.wall_time_s == 90.0
    agent = llm_agent(config.rollout, _Policy(ByteTokenizer()))  # type: ignore[arg-type]
    assert agent.config.observation_tokens == 256 and agent.config.command_timeout_s == 20.0


def test_a_bad_timeout_names_its_table_and_key(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[tasks]\nfamily = "echo"\n[rollout.timeouts]\nsetup_timeout_s = 0\n')
    with pytest.raises(ConfigError) as info:
        load_run_config(path)
    assert "[rollout.timeouts]" in str(info.value) and "setup_timeout_s must be a positive number" in str(info.value)


def test_the_token_budget_is_capped_at_the_policys_context() -> None:
    rollout = RolloutConfig(max_total_tokens=4096, max_new_tokens=64)
    assert runner_config(rollout, max_context=512).episode.budget.max_total_tokens == 512
    assert runner_config(rollout, max_context=None).episode.budget.max_total_tokens == 4096


def test_the_llm_agent_uses_the_policys_tokenizer_and_the_rollout_sampling() -> None:
    tokenizer = ByteTokenizer()
    agent = llm_agent(RolloutConfig(temperature=0.5, max_new_tokens=32), _Policy(tokenizer))  # type: ignore[arg-type]
    assert agent.chat.tokenizer is tokenizer
    assert agent.config.sampling.temperature == 0.5 and agent.config.sampling.max_new_tokens == 32
    assert agent.format.system_prompt == SYSTEM_PROMPT  # "" in the config: the default prompt
    with pytest.raises(ConfigError, match="tokenizer"):
        llm_agent(RolloutConfig(), _Policy(None))  # type: ignore[arg-type]


def test_grpo_settings_belong_to_the_training_run_only() -> None:
    assert RolloutConfig(group_size=1, temperature=0.0).group_size == 1  # an evaluation: greedy, one sample
    with pytest.raises(ConfigError, match="group_size must be >= 2"):
        RolloutSection(group_size=1)
    with pytest.raises(ConfigError, match="temperature must be > 0 for RL"):
        RolloutSection(temperature=0.0)
    rollout = RolloutConfig(concurrency=3, max_turns=2)
    assert RolloutSection.of(rollout, scale_rewards="batch") == RolloutSection(
        concurrency=3, max_turns=2, scale_rewards="batch"
    )


def test_eval_options_override_the_rollout_defaults() -> None:
    defaults = RolloutConfig()
    assert EvalConfig("builtin").rollout() == replace(defaults, group_size=1)
    given = EvalConfig("builtin", samples=3, concurrency=2, max_turns=7, temperature=0.0, host_capacity=2).rollout()
    assert given == replace(defaults, group_size=3, concurrency=2, max_turns=7, temperature=0.0, host_capacity=2)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        EvalConfig("builtin", max_total_tokens=64, max_new_tokens=128)


@pytest.fixture(scope="module")
def served_url() -> Iterator[str]:
    engine = Engine.load("tiny", EngineConfig(seed=0))
    with BackgroundServer(create_app(engine)) as server:
        yield server.url
    engine.close()


async def test_open_policy_gives_each_backend_the_models_tokenizer(served_url: str) -> None:
    async with open_policy(ModelConfig()) as embedded:
        assert isinstance(embedded, Engine) and isinstance(embedded.tokenizer, ByteTokenizer)
        assert embedded.max_context == 2048
    async with open_policy(ModelConfig(inference=served_url)) as sglang:
        # a loopback engine with SGLang's routes takes weights by broadcast ([inference] weight_sync = "auto")
        assert isinstance(sglang, BroadcastingPolicy) and isinstance(sglang.inner, SGLangClient)
        assert isinstance(sglang.tokenizer, ByteTokenizer) and sglang.max_context is None
    async with open_policy(ModelConfig(inference=served_url), fleet=FleetConfig(weight_sync="disk")) as by_disk:
        assert isinstance(by_disk, SGLangClient)
    async with open_policy(ModelConfig(inference=served_url, api="openai")) as openai:
        assert isinstance(openai, OpenAIClient) and isinstance(openai.tokenizer, ByteTokenizer)


async def test_the_update_policy_reaches_the_engine_and_the_sglang_client(served_url: str) -> None:
    async with open_policy(ModelConfig(update_policy="abort_and_resume")) as embedded:
        assert isinstance(embedded, Engine) and embedded.config.update_policy == "abort_and_resume"
    async with open_policy(ModelConfig(inference=served_url, update_policy="pause")) as sglang:
        assert isinstance(sglang, BroadcastingPolicy) and sglang.spec.update_policy == "pause"
        assert isinstance(sglang.inner, SGLangClient) and sglang.inner.update_policy == "pause"
    with pytest.raises(ConfigError, match="update_policy must be one of in_place, pause, abort_and_resume"):
        ModelConfig(update_policy="whenever")  # type: ignore[arg-type]
