"""What one episode produced: the record the trainer learns from and the benchmarks measure.

A :class:`Trajectory` is plain data and round-trips exactly through JSON
(:meth:`Trajectory.to_dict` / :meth:`Trajectory.from_dict`, one JSONL line each in
:mod:`sandrl.rollout.jsonl`), so ``--save-rollouts`` / ``--load-rollouts`` give the trainer
bit-identical batches.

For training, the token fields are what matter::

    ids        = prompt | model turn 1 | observation 1 | model turn 2 | ... | model turn k
    loss_mask  =   0..0 |    1..1      |     0..0      |    1..1      | ... |    1..1
    logprobs   =   0..0 |  lp..lp      |     0..0      |  lp..lp      | ... |  lp..lp

``ids`` is the whole conversation as the policy saw it, token for token: the chat template's
rendering of the system prompt and the task, then, per turn, the model's own output ids
(``loss_mask`` 1, with the rollout log-probs the server reported) and the ids the agent added
(the observation turn and the next assistant prefix; ``loss_mask`` 0, log-prob 0.0). Nothing
in it was re-tokenized. Agents without a model (oracle, null, replay) leave the token fields
empty.

For the trainer: group by ``group_id`` (the GRPO group; a group whose samples are not all
verified is incomplete), train on :attr:`Trajectory.trainable` ones, judge staleness by
``weight_version`` (the oldest version any token came from; per turn in ``Turn.weight_version``,
per token from :meth:`Trajectory.token_weight_versions`).

A trajectory whose ``status`` is ``infra_error`` has ``reward`` None: the machinery failed, not
the policy, and it must be dropped (or retried), never trained on as reward 0.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

EpisodeStatus = Literal["completed", "truncated", "agent_error", "infra_error"]
"""How an episode ended.

- ``completed``: the agent finished on its own (the model submitted, the oracle's script ran).
- ``truncated``: a budget ended it (``stop_reason`` says which: max_turns, max_tokens, wall_time).
- ``agent_error``: the agent failed in a way that is the policy's or the agent's fault. ``reward``
  is 0 when the policy's commands brought the sandbox down (``error.error_code`` ``sandbox_crashed``):
  trained as a failure; otherwise None.
- ``infra_error``: the sandbox, its host or the inference server failed; ``reward`` is None.
"""

STATUSES: tuple[EpisodeStatus, ...] = get_args(EpisodeStatus)

StopReason = Literal["submitted", "done", "max_turns", "max_tokens", "wall_time", "error"]
"""Why the agent stopped: the model's finish convention (``submitted``), a scripted agent ran
out of steps or a harness ended on its own (``done``), one of the three budgets, or an error."""

STOP_REASONS: tuple[StopReason, ...] = get_args(StopReason)


@dataclass(frozen=True)
class EpisodeError:
    """Why an episode failed, for machines (``error_code``, ``retryable``) and people (``message``)."""

    kind: Literal["infra", "agent"]
    phase: str
    """Where it happened: sandbox_create, setup, agent, verifier, close."""
    error_code: str
    """The :class:`~sandrl.errors.SandrlError` code (``create_failed``, ``inference_unreachable``...)
    or the exception's class name for an unexpected one."""
    message: str
    retryable: bool
    """Another attempt may succeed (a host or server hiccup), as opposed to a broken task."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpisodeError:
        return cls(**data)


@dataclass(frozen=True)
class Turn:
    """One agent turn: the model's action and what the sandbox answered."""

    index: int
    """0-based."""
    command: str | None
    """The shell command run this turn; None when the model gave none (format error, submit)."""
    output_start: int = 0
    """``ids[output_start:output_end]`` are the model's output this turn (loss mask 1);
    both 0 for agents without a model."""
    output_end: int = 0
    context_tokens: int = 0
    """Length of the prompt the model saw this turn (the context length at this turn)."""
    finish_reason: str | None = None
    """The inference server's finish reason (stop, length, abort); None without a model."""
    weight_version: int | None = None
    """Weights that produced this turn's last token."""
    start_weight_version: int | None = None
    """Weights that produced its first token, when the server says (differs only if an update landed mid-turn)."""
    exit_code: int | None = None
    timed_out: bool = False
    output_truncated: bool = False
    """The observation was cut (head and tail kept) to the observation token budget, or the sandbox's cap."""
    model_s: float = 0.0
    """Time spent waiting on the model (or the emulated think time of the replay agent)."""
    command_s: float = 0.0
    """The command's run time as the sandbox measured it."""
    sandbox_wait_s: float = 0.0
    """How long the agent (and so the model) waited on the sandbox this turn: the exec call's wall time,
    transport and queueing included."""
    observation_start: int = 0
    """``ids[observation_start:observation_end]`` are the ids appended after the model's output
    (observation turn and next assistant prefix; loss mask 0); equal when nothing was appended."""
    observation_end: int = 0
    output_weight_versions: list[int] | None = None
    """Per output token, the weights that produced it, when the server records them (the embedded
    engine does): exact for a turn that a weight update split; None: only the turn's versions are known."""
    tool_calls: list[dict[str, Any]] | None = None
    """The tool calls the model made this turn (``{"name", "arguments"}``, or ``{"error"}`` for one
    it got wrong), in ``tools`` format; None in fenced format or without a model."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def token_versions(self) -> list[int | None]:
        """The weight version of each of this turn's output ids (the exact record, else the turn's version)."""
        count = self.output_end - self.output_start
        if self.output_weight_versions is not None and len(self.output_weight_versions) == count:
            return list(self.output_weight_versions)
        return [self.weight_version] * count

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Turn:
        return cls(**data)


@dataclass(frozen=True)
class Timings:
    """Seconds per phase of one episode (the last attempt's).

    ``total_s`` runs from the moment the episode got its concurrency slot to the sandbox's
    close; ``queue_s`` is the wait before that. The orchestrator's own overhead is
    ``total_s - phases_s``.
    """

    queue_s: float = 0.0
    sandbox_create_s: float = 0.0
    setup_s: float = 0.0
    """Environment setup (working directory, SWE-bench checkout) after the sandbox exists."""
    model_s: float = 0.0
    """Sum over turns of the time waiting on the model."""
    kv_wait_s: float = 0.0
    """Of ``model_s``, the time the model calls waited for the engines' KV room before being sent
    (``[inference] kv_admission``, :mod:`sandrl.inference.kv_admission`); 0 without it."""
    command_s: float = 0.0
    """Sum over turns of the sandbox's run time of each command (per command: ``Turn.command_s``)."""
    sandbox_wait_s: float = 0.0
    """Sum over turns of the agent's wall time in exec calls (``>= command_s``)."""
    agent_s: float = 0.0
    """The agent phase's wall time (model, commands and the agent's own bookkeeping)."""
    verifier_s: float = 0.0
    """Writing the tests, running them and reading the reward."""
    close_s: float = 0.0
    total_s: float = 0.0

    @property
    def phases_s(self) -> float:
        """The time spent in the phases the orchestrator waits on."""
        return (
            self.sandbox_create_s + self.setup_s + self.model_s + self.sandbox_wait_s + self.verifier_s + self.close_s
        )

    @property
    def overhead_s(self) -> float:
        return max(0.0, self.total_s - self.phases_s)

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Timings:
        return cls(**data)


BULK_FIELDS: tuple[str, ...] = ("ids", "loss_mask", "logprobs", "turns", "verifier", "retried_errors", "agent_logs")
"""The fields whose size grows with the episode (or holds what a sandbox printed): written last,
in this order, by :meth:`Trajectory.to_dict`; ``"ids"`` is the first of them."""


@dataclass(frozen=True)
class Trajectory:
    """One episode: identity, tokens, reward, status and timings. See the module docstring."""

    episode_id: str
    """Stable: the same across retries of the episode and across runs with the same ``run_id``
    (``<group_id>/<sample_index>``)."""
    group_id: str
    """The GRPO group: every sample of one task in one step shares it (``<run_id>/<task_id>#<repeat>``)."""
    task_id: str
    sample_index: int
    """0-based position within the group."""
    agent: str
    """The agent's name: llm, oracle, null, replay."""
    status: EpisodeStatus
    stop_reason: StopReason | None = None
    reward: float | None = None
    """The verifier's reward; None unless the episode was verified (never set for infra errors)."""
    passed: bool | None = None
    attempt: int = 1
    """1-based; > 1 when earlier attempts failed with a retryable infra error."""
    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    """1 for the model's own output tokens, 0 for everything the template or the agent added."""
    logprobs: list[float] = field(default_factory=list)
    """The rollout log-prob of each id (0.0 where ``loss_mask`` is 0): importance-correction input."""
    prompt_len: int = 0
    """Length of the initial prompt (system, task, first assistant prefix): ``ids[:prompt_len]``."""
    turns: list[Turn] = field(default_factory=list)
    weight_version: int | None = None
    """The oldest weight version any of its tokens came from (what staleness is judged by);
    per turn in ``Turn.weight_version``; None for agents without a model."""
    timings: Timings = field(default_factory=Timings)
    error: EpisodeError | None = None
    retried_errors: list[EpisodeError] = field(default_factory=list)
    """The errors of earlier attempts, oldest first."""
    verifier: dict[str, Any] = field(default_factory=dict)
    """The verifier's evidence: exit_code, timed_out, error, details (per-test statuses, named rewards)."""
    sandbox_id: str | None = None
    image: str | None = None
    started_at: float = 0.0
    """Unix time the attempt started."""
    segment_starts: list[int] = field(default_factory=lambda: [0])
    """Where each *segment* of ``ids`` starts. A segment is one sequence the model saw, complete
    from its own prompt: usually the whole conversation is one (``[0]``). A harness that re-sent
    the history in a form that no longer extends the recorded ids (the session gateway's message
    matcher) starts a new segment; the trainer trains each segment as its own sequence, with the
    episode's reward (see :meth:`segments`)."""
    forked_from: dict[str, Any] | None = None
    """With ``fork_groups``, the group's prepared sandbox this episode's sandbox was forked from:
    ``parent`` (its id), ``snapshot`` (the image the episode's sandbox started from), ``image`` (the
    task's, the parent's), ``setup_s`` (the group's setup, run once and shared by its episodes, whose
    own ``timings.setup_s`` is 0), ``parent_create_s``, ``snapshot_s`` and ``attempt`` (of the
    group's setup). None: the episode set up its own sandbox."""
    engine_moves: int = 0
    """Calls of this episode that a router sent to another inference engine than its earlier ones, because
    that engine had died (:mod:`sandrl.inference.fleet`): each re-prefilled the history there. Not an
    error; 0 with one engine."""
    task_set: str = ""
    """The task set the task came from: the name of the directory holding its task directory (a
    dataset's, a generated family's, ``builtin``); the trainer's metrics are split by it. Empty in
    trajectories written before it existed."""
    agent_logs: dict[str, str] = field(default_factory=dict)
    """What an agent that runs inside the sandbox printed (a CLI agent's ``stdout`` and ``stderr``):
    the end of each, bounded (``[rollout.cli_agents] log_bytes``). Empty for other agents."""

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def weight_versions(self) -> list[int]:
        """The distinct weight versions its tokens came from, in order of use."""
        seen: dict[int, None] = {}
        for turn in self.turns:
            for v in (turn.start_weight_version, *(turn.output_weight_versions or ()), turn.weight_version):
                if v is not None:
                    seen.setdefault(v, None)
        return list(seen)

    @property
    def trainable(self) -> bool:
        """Worth a gradient: verified (a reward) and the policy produced tokens."""
        return self.reward is not None and self.status != "infra_error" and any(self.loss_mask)

    def token_weight_versions(self) -> list[int | None]:
        """Per id, the weight version that sampled it; None for ids the model did not produce.

        Exact per token when the server recorded it (a turn split by a weight update says which
        tokens came from which weights); else every token of a turn gets the turn's final version."""
        versions: list[int | None] = [None] * len(self.ids)
        for turn in self.turns:
            versions[turn.output_start : turn.output_end] = turn.token_versions()
        return versions

    def segments(self) -> list[tuple[int, int]]:
        """``(start, end)`` of each segment of ``ids``, in order; one ``(0, len(ids))`` for most episodes."""
        starts = [s for s in self.segment_starts if 0 < s < len(self.ids)]
        bounds = [0, *sorted(set(starts)), len(self.ids)]
        return [(a, b) for a, b in itertools.pairwise(bounds) if b > a] or [(0, 0)]

    def completion_ids(self) -> list[int]:
        """The model's own tokens only (loss mask 1), in order."""
        return [t for t, m in zip(self.ids, self.loss_mask, strict=True) if m]

    def to_dict(self) -> dict[str, Any]:
        # The small fields first and the bulky ones (BULK_FIELDS) last, in one fixed order: a
        # reader that wants an episode's summary (sandrl view's index of 100k episodes) parses
        # the line's head and never the ids.
        names = [f.name for f in dataclasses.fields(self)]
        data = {name: getattr(self, name) for name in names if name not in BULK_FIELDS}
        data.update((name, getattr(self, name)) for name in BULK_FIELDS)
        data["turns"] = [t.to_dict() for t in self.turns]
        data["timings"] = self.timings.to_dict()
        data["error"] = self.error.to_dict() if self.error is not None else None
        data["retried_errors"] = [e.to_dict() for e in self.retried_errors]
        data["ids"] = list(self.ids)
        data["loss_mask"] = list(self.loss_mask)
        data["logprobs"] = list(self.logprobs)
        data["verifier"] = dict(self.verifier)
        data["segment_starts"] = list(self.segment_starts)
        data["forked_from"] = dict(self.forked_from) if self.forked_from is not None else None
        data["agent_logs"] = dict(self.agent_logs)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        values = dict(data)
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown trajectory fields {sorted(unknown)}: written by a newer sandrl?")
        if values.get("status") not in STATUSES:
            raise ValueError(f"trajectory status must be one of {', '.join(STATUSES)}, got {values.get('status')!r}")
        values["turns"] = [Turn.from_dict(t) for t in values.get("turns", [])]
        values["timings"] = Timings.from_dict(values.get("timings", {}))
        error = values.get("error")
        values["error"] = EpisodeError.from_dict(error) if error is not None else None
        values["retried_errors"] = [EpisodeError.from_dict(e) for e in values.get("retried_errors", [])]
        values["status"] = cast(EpisodeStatus, values["status"])
        return cls(**values)

    def check(self) -> None:
        """Raise ValueError if the token fields disagree (lengths, mask values, turn spans)."""
        n = len(self.ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"trajectory {self.episode_id}: {n} ids, {len(self.loss_mask)} mask values, "
                f"{len(self.logprobs)} logprobs"
            )
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError(f"trajectory {self.episode_id}: loss_mask holds values other than 0 and 1")
        for turn in self.turns:
            if not 0 <= turn.output_start <= turn.output_end <= n:
                raise ValueError(f"trajectory {self.episode_id}: turn {turn.index} output span is out of range")
        if not self.segment_starts or self.segment_starts[0] != 0 or self.segment_starts != sorted(self.segment_starts):
            raise ValueError(f"trajectory {self.episode_id}: segment_starts must start at 0 and increase")
