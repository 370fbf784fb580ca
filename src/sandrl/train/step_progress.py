"""What a training step is doing while it runs: its episodes as they finish, then the trainer's work.

A step of a real run can take minutes, and its progress line is printed only once it ends. Meanwhile
one :class:`~sandrl.progress.Progress` bar says where the step is (a bar on a terminal, a plain
line every ``$SANDRL_PROGRESS_EVERY_S`` seconds in a log)::

    step 5/36 episodes: 12/16  0.85/s  ETA 5s
    step 5/36 training: 16 samples, 3100 tokens  45s
    step 5/36 saving a checkpoint  12s

Episodes are counted as they finish since the last step took its groups: in async mode some of
them belong to groups a later step will take, so the count is the rollout side's pace, not an
exact share of this step.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import TaskID

from sandrl.progress import Progress
from sandrl.rollout.trajectory import Trajectory


class StepProgress:
    """The bar of the step in progress; see the module docstring. Started by the first phase, ended by :meth:`stop`."""

    def __init__(self, steps: int, episodes_per_step: int, console: Console) -> None:
        self.steps = steps
        self.episodes_per_step = episodes_per_step
        self._progress = Progress(console=console)
        self._task: TaskID | None = None
        self._started = False
        self._phase: tuple[str, int] | None = None
        self._episodes = 0

    def episode_done(self, _: Trajectory | None = None) -> None:
        """One episode finished (the runner's ``on_episode``)."""
        self._episodes += 1
        if self._task is not None and self._phase is not None and self._phase[0] == "episodes":
            self._progress.update(self._task, completed=min(self._episodes, self.episodes_per_step))

    def rolling_out(self, step: int) -> None:
        """Step ``step`` waits for its episodes (a no-op while that step is already in a phase)."""
        if self._phase is not None and self._phase[1] == step:
            return
        total = self.episodes_per_step
        self._show("episodes", step, total=total, completed=min(self._episodes, total))

    def training(self, step: int, samples: int, tokens: int) -> None:
        """Step ``step`` has its groups; the trainer works on them."""
        self._episodes = 0  # those finishing from now on are the next step's
        self.working(step, f"training: {samples} samples, {tokens} tokens")

    def working(self, step: int, what: str) -> None:
        """Step ``step`` does ``what`` (saving a checkpoint, loading weights into the inference side)."""
        self._show(what, step, total=None, completed=0)

    def _show(self, phase: str, step: int, *, total: int | None, completed: int) -> None:
        self._phase = (phase, step)
        if self._task is not None:
            self._progress.remove_task(self._task)  # a new task: its clock starts with the phase
        description = f"step {step}/{self.steps} {phase}"
        self._task = self._progress.add_task(description, total=total, completed=completed)
        if not self._started:
            self._started = True
            self._progress.start()

    def stop(self) -> None:
        if self._started:
            self._progress.stop()
            self._started = False
        self._phase = None
