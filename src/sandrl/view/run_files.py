"""What a run's directory holds, for the viewer: a training run's or an eval's files, read as they grow.

A training run (``sandrl train``) writes ``config.toml``, ``metrics.jsonl`` and ``rollouts.jsonl``;
an eval (``sandrl eval``) writes ``config.json``, ``rollouts.jsonl`` and, once it ends,
``results.json``; ``make demo`` writes its held-out evals beside its training run. The viewer
reads these while the run writes them: a metrics line not yet ended is left for the next read.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sandrl.errors import ConfigError
from sandrl.view.episode_index import EpisodeIndex

RunKind = Literal["train", "eval", "rollouts"]
REPORT_SUFFIXES = (".html", ".png", ".svg")
"""Files linked from the page where the run dir has them (benchmark and study reports, plots)."""
MAX_REPORTS = 50
MAX_METRICS_LINE = 4 * 1024 * 1024


def _kind(directory: Path) -> RunKind:
    if (directory / "metrics.jsonl").exists() or (directory / "config.toml").exists():
        return "train"
    if (directory / "config.json").exists() or (directory / "results.json").exists():
        return "eval"
    return "rollouts"


@dataclass
class RunFiles:
    """One run directory; :meth:`refresh` reads what was appended since the last call."""

    directory: Path
    kind: RunKind = "rollouts"
    metrics: list[dict[str, Any]] = field(default_factory=list)
    episodes: EpisodeIndex = field(init=False)
    _metrics_bytes: int = 0
    _steps: list[int | None] = field(default_factory=list)
    _steps_key: tuple[int, int] = (-1, -1)

    def __post_init__(self) -> None:
        self.episodes = EpisodeIndex(self.directory / "rollouts.jsonl")

    @classmethod
    def open(cls, directory: str | Path) -> RunFiles:
        """The run in ``directory``; a ConfigError that says what a run directory holds if it is not one."""
        path = Path(directory).expanduser()
        if not path.is_dir():
            raise ConfigError(
                f"{directory}: no such directory; give the output directory of a run "
                "(`[run] output_dir` of `sandrl train`, or the results directory `sandrl eval` printed)"
            )
        names = ("metrics.jsonl", "rollouts.jsonl", "results.json", "config.toml", "config.json")
        if not any((path / name).exists() for name in names):
            hint = _nested_runs(path)
            raise ConfigError(
                f"{directory} is not a run directory: it holds none of {', '.join(names)}"
                + (f"; the runs under it: {hint}" if hint else "")
            )
        run = cls(path.resolve(), kind=_kind(path))
        return run

    def refresh(self) -> None:
        self.kind = _kind(self.directory)
        self._read_metrics()
        self.episodes.refresh()

    @property
    def data_positions(self) -> list[int]:
        """Per step, the first data position not yet trained (what places a group in a step)."""
        positions: list[int] = []
        for record in self.metrics:
            value = record.get("data_position")
            if isinstance(value, int) and not isinstance(value, bool):
                positions.append(max(value, positions[-1]) if positions else value)
        return positions

    def episode_steps(self) -> list[int | None]:
        """Per episode, the step that trained it (None: not trained yet, or an eval's)."""
        key = (len(self.episodes), len(self.metrics))
        if key != self._steps_key:
            self._steps, self._steps_key = self.episodes.steps(self.data_positions), key
        return self._steps

    def config(self) -> dict[str, Any]:
        """The run's resolved config (a training run's ``config.toml``, an eval's ``config.json``); {} if unreadable."""
        try:
            if (self.directory / "config.toml").exists():
                return tomllib.loads((self.directory / "config.toml").read_text(encoding="utf-8"))
            if (self.directory / "config.json").exists():
                data = json.loads((self.directory / "config.json").read_text(encoding="utf-8"))
                return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}
        return {}

    def results(self) -> dict[str, Any] | None:
        """An eval's ``results.json`` once it has ended."""
        return _json_file(self.directory / "results.json")

    def heldout(self) -> list[dict[str, Any]]:
        """Held-out pass rates measured for this run: ``make demo``'s before and after RL (its
        ``demo.json`` beside the run), as ``{"label", "step", "pass_rate", "episodes"}``."""
        demo = _json_file(self.directory.parent / "demo.json")
        if not demo:
            return []
        steps = len(self.metrics)
        points = []
        for label, step in (("heldout_before", 0), ("heldout_after", steps)):
            value = demo.get(label)
            if isinstance(value, dict) and isinstance(value.get("pass_rate"), int | float):
                points.append(
                    {"label": label, "step": step, "pass_rate": value["pass_rate"], "episodes": value.get("episodes")}
                )
        return points

    def reports(self) -> list[str]:
        """HTML reports and plots in the run dir or its parent (relative names, at most :data:`MAX_REPORTS`)."""
        found: list[str] = []
        for base, prefix in ((self.directory, ""), (self.directory.parent, "../")):
            if prefix and not (self.directory.parent / "demo.json").exists():
                continue
            for path in sorted(base.iterdir()) if base.is_dir() else ():
                if path.is_file() and not path.is_symlink() and path.suffix.lower() in REPORT_SUFFIXES:
                    found.append(prefix + path.name)
            if (base / "bench").is_dir():
                for path in sorted((base / "bench").iterdir()):
                    if path.is_file() and not path.is_symlink() and path.suffix.lower() in REPORT_SUFFIXES:
                        found.append(f"{prefix}bench/{path.name}")
        return found[:MAX_REPORTS]

    def report_path(self, name: str) -> Path | None:
        """The file a report link names, if it is one that :meth:`reports` lists (nothing else is served)."""
        if name not in self.reports():
            return None
        return (self.directory / name).resolve()

    def model_for_tokens(self) -> str | None:
        """The model whose tokenizer decodes the run's ids: the newest checkpoint's, else the config's."""
        checkpoints = self.directory / "checkpoints"
        if checkpoints.is_dir():
            models = sorted(p / "model" for p in checkpoints.iterdir() if (p / "model").is_dir())
            if models:
                return str(models[-1])
        config = self.config()
        model = config.get("model")
        name = model.get("name") if isinstance(model, dict) else model
        if not isinstance(name, str) or not name:
            return None
        if name == "tiny" or Path(name).is_absolute():
            return name
        for base in (Path.cwd(), self.directory, *self.directory.parents):
            if (base / name).exists():
                return str(base / name)
        return name

    def _read_metrics(self) -> None:
        path = self.directory / "metrics.jsonl"
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return
        if size < self._metrics_bytes:  # replaced: a new run in the same directory
            self.metrics, self._metrics_bytes = [], 0
        with path.open("rb") as file:
            file.seek(self._metrics_bytes)
            data = file.read(size - self._metrics_bytes)
        end = data.rfind(b"\n")
        if end < 0:
            return
        for line in data[: end + 1].splitlines():
            if not line.strip() or len(line) > MAX_METRICS_LINE:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                self.metrics.append(record)
        self._metrics_bytes += end + 1


def _json_file(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _nested_runs(path: Path) -> str:
    runs = sorted(str(p.parent.relative_to(path)) for p in path.glob("*/rollouts.jsonl"))
    runs += sorted(str(p.parent.relative_to(path)) for p in path.glob("*/*/rollouts.jsonl"))
    return ", ".join(runs[:5])
