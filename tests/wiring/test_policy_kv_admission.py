"""``[inference] kv_admission`` and ``kv_cache_tokens`` as a run's TOML gives them: the policy behind the gate,
the engine's bound, the launched engines' flag, and bad values refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandrl.errors import ConfigError
from sandrl.inference.engine import Engine
from sandrl.inference.fleet.commands import engine_command
from sandrl.inference.fleet.config import FleetConfig
from sandrl.inference.kv_admission import AdmittedPolicy, admission_stats
from sandrl.train.run_config import load_run_config
from sandrl.wiring.config import ModelConfig
from sandrl.wiring.policy import open_policy


def _load(tmp_path: Path, inference: str, overrides: tuple[str, ...] = ()) -> FleetConfig:
    file = tmp_path / "run.toml"
    file.write_text(f'[tasks]\nfamily = "echo"\n\n[inference]\n{inference}')
    return load_run_config(file, overrides).inference


def test_the_settings_are_read_from_toml_and_overrides(tmp_path: Path) -> None:
    fleet = _load(tmp_path, "kv_admission = true\nkv_cache_tokens = 4096\nkv_admission_interval_s = 0.25\n")
    assert (fleet.kv_admission, fleet.kv_cache_tokens, fleet.kv_admission_interval_s) == (True, 4096, 0.25)
    assert fleet.admission_config().interval_s == 0.25 and fleet.admission_config().max_queued == 0
    assert _load(tmp_path, "", ("inference.kv_admission_max_queued=3",)).kv_admission_max_queued == 3
    with pytest.raises(ConfigError, match=r"kv_admission_interval_s must be between 0\.01 and 60"):
        _load(tmp_path, "", ("inference.kv_admission_interval_s=0",))
    with pytest.raises(ConfigError, match="kv_admission_max_queued"):
        _load(tmp_path, "kv_admission_max_queued = -2\n")


async def test_the_in_process_engine_is_bounded_and_gated_only_when_asked() -> None:
    async with open_policy(ModelConfig(), fleet=FleetConfig(kv_admission=True, kv_cache_tokens=2048)) as policy:
        assert isinstance(policy, AdmittedPolicy) and isinstance(policy.inner, Engine)
        assert policy.inner.config.kv_cache_tokens == 2048
        assert policy.vocab_size == policy.inner.vocab_size  # everything else is the engine's
        assert admission_stats(policy) == policy.admission.stats()
    async with open_policy(ModelConfig(), fleet=FleetConfig(kv_cache_tokens=2048)) as plain:
        assert isinstance(plain, Engine) and admission_stats(plain) is None


def test_launched_embedded_engines_get_the_bound() -> None:
    bounded = engine_command(FleetConfig(launch="embedded", kv_cache_tokens=999), 0, model="tiny", port=9, token="s")
    assert bounded.argv[-2:] == ("--kv-cache-tokens", "999")
    unbounded = engine_command(FleetConfig(launch="embedded"), 0, model="tiny", port=9, token="s")
    assert "--kv-cache-tokens" not in unbounded.argv
    own = FleetConfig(launch="embedded", kv_cache_tokens=999, args=("--kv-cache-tokens=5",))
    assert engine_command(own, 0, model="tiny", port=9, token="s").argv.count("--kv-cache-tokens") == 0
