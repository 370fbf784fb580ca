"""Every config in ``configs/`` loads with the real loader, and every key it names (commented ones too) is real.

The examples for real runs name a model directory and a Harbor dataset this machine does not
have: as written they load, and opening them says plainly that the paths do not exist; with the
paths pointed at fixtures (``--set``), the model and the tasks load. On a CPU-only torch,
``sandrl train`` on them stops at once with the pip command of a CUDA build.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from sandrl.cli import app
from sandrl.errors import ConfigError
from sandrl.inference.model import build_tiny_model, load_model, save_weights
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.train.device import CUDA_INSTALL
from sandrl.train.run_config import SECTION_TYPES, load_run_config, save_resolved
from sandrl.wiring import load_task_set

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.toml"))
REAL_RUNS = [p for p in CONFIGS if p.name.startswith("qwen3-")]
CPU_ONLY = torch.version.cuda is None and getattr(torch.version, "hip", None) is None


def test_configs_holds_the_tiny_run_that_learns_and_the_real_run_examples() -> None:
    names = {p.name for p in CONFIGS}
    assert {"tiny.toml", "tiny-learn.toml", "qwen3-sglang-harbor.toml", "qwen3-vllm-harbor-async.toml"} <= names
    learn = load_run_config(REPO / "configs" / "tiny-learn.toml")
    assert learn.warm_start.enabled and learn.model.name == "tiny"
    modes = {load_run_config(p).run.mode for p in REAL_RUNS}
    apis = {load_run_config(p).model.api for p in REAL_RUNS}
    assert modes == {"sync", "async"} and apis == {"sglang", "vllm"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_loads_and_reads_back_resolved(path: Path, tmp_path: Path) -> None:
    config = load_run_config(path)
    assert load_run_config(save_resolved(config, tmp_path / "config.toml")) == config


def _table_classes() -> dict[str, type[Any]]:
    """Each table a run config can hold (``train.loss``, ``warm_start.tiny``...) and the class it is read into."""
    found: dict[str, type[Any]] = {}

    def walk(name: str, cls: type[Any]) -> None:
        found[name] = cls
        for f, hint in zip(dataclasses.fields(cls), typing.get_type_hints(cls).values(), strict=False):
            inner = next(
                (a for a in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(a) and isinstance(a, type)),
                None,
            )
            if inner is not None:
                walk(f"{name}.{f.name}", inner)

    for name, cls in SECTION_TYPES.items():
        walk(name, cls)
    return found


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_key_a_config_names_is_real_commented_ones_too(path: Path) -> None:
    tables = _table_classes()
    table = ""
    named: list[tuple[str, str]] = []
    for line in path.read_text().splitlines():
        header = re.match(r"^#?\s*\[([\w.]+)\]", line)
        if header:
            table = header.group(1)
            assert table in tables, f"{path.name}: no table [{table}]"
            continue
        key = re.match(r"^#?\s?(\w+)\s*=\s*\S", line)
        if key and table:
            named.append((table, key.group(1)))
    assert named
    for table_name, key_name in named:
        fields = {f.name for f in dataclasses.fields(tables[table_name])}
        assert key_name in fields, f"{path.name}: [{table_name}] has no key {key_name}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint directory as a real run's [model] name is one (config.json, weights, tokenizer)."""
    net, tokenizer = build_tiny_model(TinyModelConfig(architecture="qwen3", hidden_size=32, num_layers=1))
    return save_weights(net, tmp_path_factory.mktemp("model") / "qwen3-tiny", tokenizer)


@pytest.fixture(scope="module")
def harbor_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Harbor dataset of one task, laid out as Harbor writes them."""
    root = tmp_path_factory.mktemp("harbor")
    task = root / "hello"
    for sub in ("environment", "tests", "solution"):
        (task / sub).mkdir(parents=True)
    (task / "instruction.md").write_text("Write hello to /app/out.txt.\n")
    (task / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n[agent]\ntimeout_sec = 120.0\n')
    (task / "environment" / "Dockerfile").write_text("FROM host\nWORKDIR /app\n")
    verify = "#!/bin/sh\ngrep -q hello /app/out.txt && echo 1 > /logs/verifier/reward.txt\n"
    (task / "tests" / "test.sh").write_text(verify)
    (task / "solution" / "solve.sh").write_text("#!/bin/sh\necho hello > /app/out.txt\n")
    return root


@pytest.mark.parametrize("path", REAL_RUNS, ids=lambda p: p.name)
def test_a_real_run_config_says_its_paths_do_not_exist_and_runs_on_real_ones(
    path: Path, model_dir: Path, harbor_tasks: Path
) -> None:
    config = load_run_config(path)
    with pytest.raises(ConfigError, match=f"model path {config.model.name} does not exist: pass 'tiny' or a local"):
        load_model(config.model.name)
    with pytest.raises(ConfigError, match=f"{config.tasks.path}: does not exist"):
        load_task_set(config.tasks.path)
    given = load_run_config(path, [f"model.name={model_dir}", f"tasks.path={harbor_tasks}"])
    assert load_model(given.model.name)[2] == str(model_dir)
    assert [t.id for t in load_task_set(given.tasks.path)] == ["hello"]


@pytest.mark.skipif(not CPU_ONLY, reason="this torch is a CUDA build")
@pytest.mark.parametrize("path", REAL_RUNS, ids=lambda p: p.name)
def test_a_real_run_on_a_cpu_only_torch_names_the_pip_command(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["train", str(path)])
    assert isinstance(result.exception, ConfigError), result.output
    assert "is a CPU-only build: install a CUDA build" in result.exception.message
    assert CUDA_INSTALL in result.exception.message and CUDA_INSTALL in path.read_text()
    assert not (tmp_path / "runs").exists()  # nothing written


def test_the_readme_leads_with_the_config_that_learns() -> None:
    readme = (REPO / "README.md").read_text()
    first = re.search(r"^(?:\.venv/bin/)?sandrl train (\S+)", readme, re.MULTILINE)
    assert first is not None and first.group(1) == "configs/tiny-learn.toml"
    assert tomllib.loads((REPO / "configs" / "tiny-learn.toml").read_text())["warm_start"]["enabled"] is True
