"""``[warm_start]``: how the supervised warm start trains (see :mod:`sandrl.train.warmstart`), apart from
its code, so that reading a run's config loads no PyTorch."""

from __future__ import annotations

from dataclasses import dataclass, field

from sandrl.errors import ConfigError
from sandrl.inference.tiny_config import TinyModelConfig


@dataclass(frozen=True)
class WarmStartConfig:
    """How long and how hard the warm start trains, and the shape of the model it starts from."""

    steps: int = 400
    """Supervised updates (at most: ``stop_at_greedy`` or ``stop_at_sampled`` can stop it earlier)."""
    batch_size: int = 16
    """Demonstrations per update, drawn without replacement within a pass over them."""
    lr: float = 3e-3
    """AdamW's peak learning rate. 3e-3 suits the tiny model trained from scratch; a pretrained
    model needs about 1e-5."""
    warmup_steps: int = 10
    """Updates over which the learning rate rises linearly to ``lr``."""
    seed: int = 0
    """Seeds the order of the demonstrations (``tiny.seed`` seeds the model's initialisation)."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """The shape of the model built from a config (when the model warm-started is ``tiny``)."""
    stop_at_greedy: float | None = None
    """Stop before ``steps`` once greedy decoding reproduces at least this fraction of the check
    demonstrations: the policy has learned the format and the skill's argmax, and sampling from
    it still fails often enough that RL has groups to learn from. None: always ``steps``."""
    stop_at_sampled: float | None = None
    """Stop before ``steps`` once one sample at temperature 1 writes a check demonstration's reply
    with at least this mean probability (``sampled``): the pass rate RL starts from, about, so
    every seed starts RL from a comparable policy. Greedy decoding can jump from a few percent to
    all of the checks between two checks while the sampled rate climbs steadily. None: no such stop;
    with both set, the first reached stops."""
    group_size: int = 8
    """The RL run's episodes per task, for the ``coverage`` reported at each check: the fraction of
    the check demonstrations a group of this many samples at temperature 1 would write at least
    once (``1 - (1 - p)^n`` from each reply's probability ``p``, exact, no sampling). GRPO learns
    only from groups where some episode passes: a task below it stays unsolved however long RL
    runs."""
    check_every: int = 25
    """Updates between two checks on the check demonstrations."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.check_every < 1 or self.group_size < 1:
            raise ConfigError(
                "warm start steps, batch_size, check_every and group_size must be >= 1, "
                f"got {self.steps}, {self.batch_size}, {self.check_every} and {self.group_size}"
            )
        for name in ("stop_at_greedy", "stop_at_sampled"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 1:
                raise ConfigError(f"{name} is a fraction in (0, 1], got {value}")
