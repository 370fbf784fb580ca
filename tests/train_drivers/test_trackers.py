"""``[run] trackers``: a real ``sandrl train`` run logs each step to TensorBoard, W&B (offline) and MLflow
(a file store), read back here with each library's own reader; a tracker that fails is reported once."""

from __future__ import annotations

import asyncio
import json
import re
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sandrl.cli import app
from sandrl.errors import ConfigError
from sandrl.train.run_config import from_dict
from sandrl.train.session import Session
from sandrl.train.trackers.base import scalars
from sandrl.train.trackers.episodes import TEXT_CHARS, conversation
from sandrl.train.trackers.mlflow_tracker import MlflowTracker

from .conftest import write_saved_groups

CONFIG = """
[run]
output_dir = "out"
steps = 2
groups_per_step = 1
trackers = [{trackers}]

[tasks]
family = "echo"

[rollout]
max_turns = 4
"""
# The metrics every step has, and what the trainer adds: each tracker must hold these, per step, as written.
CHECKED = (
    "reward_mean",
    "pass_rate",
    "samples_trained",
    "train/loss",
    "train/stale_0/mismatch_kl",
    "train/stale_1/mismatch_kl",
)


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The run's directory, with every tracker kept off the network and out of the home directory."""
    monkeypatch.chdir(tmp_path)
    for name in ("WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    # The MLflow tracker sets MLFLOW_ALLOW_FILE_STORE where it is unset (as here): restored unset after the test.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    write_saved_groups(tmp_path / "saved.jsonl", groups=2)
    return tmp_path


def train(trackers: str) -> Any:
    Path("run.toml").write_text(CONFIG.format(trackers=trackers))
    return CliRunner().invoke(app, ["train", "run.toml", "--load-rollouts", "saved.jsonl"])


def test_each_tracker_holds_the_steps_of_metrics_jsonl(offline: Path) -> None:
    result = train('"jsonl", "tensorboard", "wandb", "mlflow"')
    assert result.exit_code == 0, result.output
    assert "warning: tracker" not in result.output, result.output
    # Where the trackers and the run's page are, said at the start.
    assert "trackers: metrics.jsonl, tensorboard -> " in result.output
    assert re.search(r"view: sandrl view \S*out  \(the run's page", result.output), result.output
    steps = [json.loads(line) for line in Path("out/metrics.jsonl").read_text().splitlines()]
    # Step 1 trains on weights v0 and step 2 on v1: each of the stale_N keys is in one step only.
    want = {key: [(s["step"], pytest.approx(float(s[key]), rel=1e-6)) for s in steps if key in s] for key in CHECKED}
    assert all(want.values()), want
    assert [s["step"] for s in steps] == [1, 2]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator("out/tensorboard")
    events.Reload()
    assert {key: [(e.step, e.value) for e in events.Scalars(key)] for key in CHECKED} == want
    assert "staleness_hist/0" in events.Tags()["scalars"]  # a table made one curve per entry
    assert "config/text_summary" in events.Tags()["tensors"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(offline / "out/mlruns").as_uri())
    experiment = client.get_experiment_by_name("sandrl")
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "out"
    history = {key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)] for key in CHECKED}
    assert history == want
    assert run.data.params["run.steps"] == "2"
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "episodes/step_000002.json")).read_text())
    assert [row[table["columns"].index("task")] for row in table["data"]] == ["t", "t"]
    # Decoded by the trainer's (tiny, byte) tokenizer: ids 1-4 are control bytes, shown as their escapes.
    assert [row[table["columns"].index("text")] for row in table["data"]] == ["\\x01\\x02\\x03\\x04"] * 2

    [log] = list((offline / "out/wandb").glob("offline-run-*/run-*.wandb"))
    history, config = wandb_records(log)
    assert {key: [(h["_step"], h[key]) for h in history if key in h] for key in CHECKED} == want
    assert json.loads(config["run"])["steps"] == 2
    assert [h["episodes/nrows"] for h in history if "episodes/nrows" in h] == [2, 2]


def wandb_records(path: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The history rows and the config of an offline W&B run, from its ``.wandb`` file.

    wandb writes it in LevelDB's log format (32 KiB blocks of records, each with a 7-byte header:
    crc32, length, type; a record split across blocks is FIRST, MIDDLE..., LAST), after a 7-byte
    file header; each record is a ``wandb_internal_pb2.Record``. wandb no longer ships a Python
    reader of its own, so this is one.
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32 * 1024, b""
    history: list[dict[str, Any]] = []
    config: dict[str, str] = {}
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind not in (1, 4):
            continue
        record = wandb_internal_pb2.Record()
        record.ParseFromString(pending)
        which = record.WhichOneof("record_type")
        if which == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
        elif which in ("run", "config"):
            updates = record.run.config.update if which == "run" else record.config.update
            config.update({u.key: u.value_json for u in updates})
    return history, config


def test_a_tracker_that_raises_is_reported_once_and_the_run_goes_on(
    offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def server_down(self: MlflowTracker, *args: object) -> None:
        raise ConnectionError("http://mlflow.invalid:5000: connection refused")

    monkeypatch.setattr(MlflowTracker, "log_step", server_down)
    result = train('"tensorboard", "mlflow"')
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if "warning: tracker" in line]
    assert len(warnings) == 1, result.output
    assert "tracker mlflow failed logging step 1 (ConnectionError" in warnings[0]
    assert "MLFLOW_TRACKING_URI" in warnings[0]  # what to do
    assert len(Path("out/metrics.jsonl").read_text().splitlines()) == 2

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator("out/tensorboard")
    events.Reload()
    assert [e.step for e in events.Scalars("reward_mean")] == [1, 2]


def test_a_tracker_that_cannot_open_is_reported_and_the_run_goes_on(
    offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:///proc/no-such-dir/mlruns")
    result = train('"mlflow"')
    assert result.exit_code == 0, result.output
    assert result.output.count("warning: tracker mlflow failed opening") == 1, result.output
    assert len(Path("out/metrics.jsonl").read_text().splitlines()) == 2


def test_an_unknown_tracker_is_refused_at_load_with_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as refused:
        from_dict({"run": {"trackers": ["jsonl", "neptune"]}, "tasks": {"family": "echo"}})
    assert refused.value.message == (
        "config: [run]: unknown tracker 'neptune'; valid trackers are jsonl, tensorboard, wandb, mlflow"
    )


def test_a_tracker_whose_library_is_missing_is_refused_at_load_with_the_pip_command(
    offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` sees where it is not installed
    result = train('"wandb"')
    assert isinstance(result.exception, ConfigError), result.output  # `sandrl` prints its message, one line
    assert result.exception.message == (
        "run.toml: [run]: tracker 'wandb' needs wandb, which is not installed: pip install 'sandrl[trackers]' "
        "(or drop 'wandb' from [run] trackers)"
    )
    assert not Path("out/metrics.jsonl").exists()


def test_metrics_are_made_flat_numbers() -> None:
    record = {"step": 3, "time": 1.0, "mode": "sync", "reward_mean": 0.5, "staleness_hist": {"0": 4, "1": 2}}
    record["train/stale_1/mismatch_kl"] = 0.01
    assert scalars(record) == {
        "reward_mean": 0.5,
        "staleness_hist/0": 4.0,
        "staleness_hist/1": 2.0,
        "train/stale_1/mismatch_kl": 0.01,
    }


class Chars:
    """A tokenizer edge: each id is one character (what the episode text is made of)."""

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        return "".join(map(chr, ids))


def test_an_episodes_text_is_bounded_and_shows_escapes_as_text() -> None:
    hostile = "\x1b[2J\x00<script>alert(1)</script>\n" + "x" * 100_000 + "the end"
    text = conversation([ord(c) for c in hostile], Chars())  # type: ignore[arg-type]
    assert len(text) <= TEXT_CHARS + 100
    assert text.startswith("\\x1b[2J\\x00<script>") and text.endswith("the end")
    assert "\x1b" not in text and "\x00" not in text
    assert "cut here" in text
    assert conversation([1, 2, 3], None) == "(3 ids; no tokenizer at hand to decode them)"


def test_a_run_stopped_by_ctrl_c_closes_its_trackers_with_the_steps_it_did(
    offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    train_step = Session.train

    async def interrupted(self: Session, items: Any, **extra: float) -> dict[str, Any]:
        # What SIGINT does (sandrl.interrupt): the command's task is cancelled while the step runs.
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        return await train_step(self, items, **extra)

    monkeypatch.setattr(Session, "train", interrupted)
    with pytest.raises(asyncio.CancelledError):  # `sandrl train` makes it "interrupted: ...", exit 130
        train('"tensorboard", "mlflow"')
    assert len(Path("out/metrics.jsonl").read_text().splitlines()) == 1

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(offline / "out/mlruns").as_uri())
    experiment = client.get_experiment_by_name("sandrl")
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "KILLED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "reward_mean")] == [1]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator("out/tensorboard")
    events.Reload()
    assert [e.step for e in events.Scalars("reward_mean")] == [1]
