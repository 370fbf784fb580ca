"""Several training ranks driven as one trainer: ``[train] processes = N`` on this host.

:class:`RankGroup` starts N processes, each rank of one ``torch.distributed`` process group (NCCL
on GPUs, one GPU per rank; gloo on CPU, over loopback) holding a :class:`~sandrl.train.trainer.Trainer`
whose policy FSDP2 shards across them. The drivers see one trainer (the
:class:`~sandrl.train.session.StepTrainer` protocol): every call goes to every rank, which run
it together, and rank 0's answer comes back.

A rank that dies (killed, out of memory, a crash in a kernel) ends the call with a
:class:`~sandrl.errors.TrainError` naming the rank and its exit code; the other ranks are stopped
(they would wait in a collective forever), and the run resumes from its last checkpoint.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import tempfile
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from sandrl.errors import ConfigError, SandrlError, TrainError
from sandrl.inference.weight_push import BroadcastSpec
from sandrl.train.batch import Batch, TrainSample
from sandrl.train.config import TrainConfig
from sandrl.train.trainer import ExportedWeights, Metrics

_PR_SET_PDEATHSIG = 1
_START_TIMEOUT_S = 600.0
"""Loading a large model into every rank takes minutes; past this, a rank is considered stuck."""


def needs_ranks(config: TrainConfig) -> bool:
    """Whether the trainer runs as FSDP2 ranks: several processes, or what only FSDP2 provides (bf16 with
    float32 master weights, offloading)."""
    return config.processes > 1 or config.dtype == "bf16" or config.offload_optimizer


@dataclass(frozen=True)
class RankSpec:
    """What every rank builds: the same model, config and checkpoint."""

    model: str
    """``[model] name``: ``tiny`` or a local Hugging Face checkpoint directory."""
    train: TrainConfig
    resume_from: str | None = None
    collective_timeout_s: float = 1800.0
    """How long a rank waits in a collective for the others (a dead peer is noticed by the driver first)."""


class RankCalls:
    """A trainer of several ranks as the driver sees it: each call is made on every rank at once (``_call``,
    rank 0's answer back), here in local processes (:class:`RankGroup`) or in Ray actors
    (:class:`sandrl.cluster.ray.RemoteRanks`)."""

    steps: int
    version: int
    data_position: int
    data_done: tuple[int, ...]

    def _call(self, method: str, *args: Any) -> Any:
        raise NotImplementedError

    def step(self, batch: Batch) -> Metrics:
        metrics: Metrics = self._call("step", batch)
        self.steps, self.version = int(metrics["step"]), int(metrics["weight_version"])
        return metrics

    def export_weights(self, directory: str | Path) -> ExportedWeights:
        exported: ExportedWeights = self._call("export_weights", str(directory))
        return exported

    def broadcast_weights(self, spec: BroadcastSpec) -> str | None:
        """Every rank gathers the full tensors bucket by bucket; rank 0 sends them to the engines."""
        why: str | None = self._call("broadcast_weights", spec)
        return why

    def save_checkpoint(self, root: str | Path) -> Path:
        return Path(self._call("save_checkpoint", str(root), self.data_position, self.data_done))


class RankGroup(RankCalls):
    """N training processes acting as one trainer (the drivers' ``StepTrainer``)."""

    def __init__(self, spec: RankSpec) -> None:
        self.size = spec.train.processes
        context = multiprocessing.get_context("spawn")  # CUDA and forked torch do not mix
        self._store = tempfile.mkdtemp(prefix="sandrl-ranks-")
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        try:
            with _rank_environment(spec.train):
                self._start(context, spec)
            state = self._gather("start", timeout_s=_START_TIMEOUT_S)[0]
        except BaseException:
            self.close()
            raise
        self.steps, self.version, self.data_position, self.data_done = state
        self.data_done = tuple(self.data_done)

    def _start(self, context: Any, spec: RankSpec) -> None:
        for rank in range(self.size):
            mine, theirs = context.Pipe()
            proc = context.Process(
                target=_rank_main,
                args=(rank, self.size, f"file://{self._store}/store", spec, theirs),
                name=f"sandrl-rank-{rank}",
                daemon=True,
            )
            proc.start()
            theirs.close()
            self._conns.append(mine)
            self._procs.append(proc)

    # -- the trainer's calls ---------------------------------------------------------------------

    def sft_step(self, samples: Sequence[TrainSample]) -> Metrics:
        metrics: Metrics = self._call("sft_step", list(samples))
        self.steps, self.version = int(metrics["step"]), int(metrics["weight_version"])
        return metrics

    def logprobs(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        table: list[list[float]] = self._call("logprobs", list(samples))
        return table

    def load_checkpoint(self, path: str | Path) -> None:
        state = self._call("load_checkpoint", str(path))
        self.steps, self.version, self.data_position, self.data_done = state

    @property
    def pids(self) -> tuple[int, ...]:
        """The ranks' process ids, rank 0 first (empty once they were stopped)."""
        return tuple(int(p.pid) for p in self._procs)

    def close(self) -> None:
        """Stop every rank (politely, then not)."""
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("stop", ()))
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []
        with contextlib.suppress(OSError):
            for leftover in Path(self._store).iterdir():
                leftover.unlink()
            os.rmdir(self._store)

    def __enter__(self) -> RankGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------------

    def _call(self, method: str, *args: Any) -> Any:
        if not self._procs:
            raise TrainError("the training ranks were stopped after an earlier failure; rerun to resume")
        for conn in self._conns:
            with contextlib.suppress(OSError):  # a dead rank: its sentinel tells _gather
                conn.send((method, args))
        return self._gather(method)[0]

    def _gather(self, method: str, timeout_s: float | None = None) -> list[Any]:
        """Every rank's answer to ``method``; a rank that dies or fails ends the call for all."""
        answers: dict[int, Any] = {}
        by_conn = {id(c): r for r, c in enumerate(self._conns)}
        by_sentinel = {p.sentinel: r for r, p in enumerate(self._procs)}
        while len(answers) < self.size:
            waiting = [c for r, c in enumerate(self._conns) if r not in answers]
            ready = wait([*waiting, *by_sentinel], timeout=timeout_s)
            if not ready:
                self._abort()
                raise TrainError(
                    f"the training ranks did not answer {method} within {timeout_s:.0f} s; they were stopped"
                )
            for item in ready:
                if isinstance(item, Connection):
                    rank = by_conn[id(item)]
                    try:
                        kind, value = item.recv()
                    except (EOFError, OSError):  # the rank died: a closed pipe, or a reset one
                        continue  # its sentinel says why (it is ready now, or in a moment)
                    if kind != "ok":
                        self._abort()
                        raise _error(kind, value, rank, method)
                    answers[rank] = value
                elif isinstance(item, int) and by_sentinel[item] not in answers:
                    rank = by_sentinel[item]
                    self._procs[rank].join(timeout=5)  # reaped, so its exit code is known
                    code = self._procs[rank].exitcode
                    self._abort()
                    raise TrainError(
                        f"training rank {rank} of {self.size} died (exit code {code}) during {method}; the other ranks "
                        "were stopped. Rerun the same command to resume from the last checkpoint (nothing written "
                        "is lost); if it dies again, check its memory (sandrl train --plan) and the kernel log"
                    )
        return [answers[r] for r in range(self.size)]

    def _abort(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join(timeout=10)
        self._procs = []


@contextlib.contextmanager
def _rank_environment(train: TrainConfig) -> Iterator[None]:
    """The environment the ranks start with: on CPU, glibc returns large freed blocks to the system.

    FSDP2 frees each layer's gathered parameters after use; glibc's default keeps such blocks in its
    heap, and two CPU ranks then held as much memory as one process (measured: 0.98x; with this, 0.56x).
    """
    key = "MALLOC_MMAP_THRESHOLD_"
    if train.device != "cpu" or key in os.environ:
        yield
        return
    os.environ[key] = "65536"
    try:
        yield
    finally:
        os.environ.pop(key, None)


def _error(kind: str, value: Any, rank: int, method: str) -> SandrlError:
    if kind == "config":
        return ConfigError(str(value))
    if kind == "train":
        return TrainError(str(value))
    return TrainError(f"training rank {rank} failed during {method}:\n{value}")


# -- inside a rank -----------------------------------------------------------------------------------


def start_rank(rank: int, size: int, init_method: str, spec: RankSpec, *, loopback: bool) -> Any:
    """Join the training group as ``rank`` of ``size`` and build this rank's trainer (resumed if asked).

    ``loopback``: every rank runs on this host, so gloo talks over ``lo`` only. Ray's rank actors
    (:mod:`sandrl.cluster.ray`) call this too.
    """
    import torch
    import torch.distributed as dist

    from sandrl.inference.model import load_model
    from sandrl.train.trainer import Trainer

    on_gpu = spec.train.device.startswith("cuda")
    if on_gpu:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    else:
        if loopback:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    dist.init_process_group(
        "nccl" if on_gpu else "gloo",
        init_method=init_method,
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=spec.collective_timeout_s),
    )
    model, tokenizer, _ = load_model(spec.model)
    trainer = Trainer(model, spec.train, tokenizer=tokenizer)
    if spec.resume_from is not None:
        trainer.load_checkpoint(spec.resume_from)
    return trainer


def answer(trainer: Any, method: str, args: tuple[Any, ...]) -> Any:
    """Run the driver's call ``method(*args)`` on this rank's trainer; what rank 0 answers goes back."""
    if method == "save_checkpoint":
        root, trainer.data_position, done = args
        trainer.data_done = tuple(done)
        return trainer.save_checkpoint(root)
    if method == "load_checkpoint":
        trainer.load_checkpoint(*args)
        return rank_state(trainer)
    if method in ("step", "sft_step", "logprobs", "export_weights", "broadcast_weights"):
        return getattr(trainer, method)(*args)
    raise TrainError(f"a training rank got an unknown call {method!r}")


def rank_state(trainer: Any) -> tuple[int, int, int, tuple[int, ...]]:
    """The counters the driver mirrors: steps, weight version, data position, positions done above it."""
    return trainer.steps, trainer.version, trainer.data_position, tuple(trainer.data_done)


def _rank_main(rank: int, size: int, store: str, spec: RankSpec, conn: Connection) -> None:
    """One rank: join the group, build the trainer, then run the driver's calls until told to stop."""
    import torch.distributed as dist

    # The driver decides how a run stops: a Ctrl-C or a SIGTERM sent to the whole process group lets it
    # finish the step and save; and a rank never outlives its driver (it would wait in a collective).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    try:
        trainer = start_rank(rank, size, store, spec, loopback=True)
        conn.send(("ok", rank_state(trainer)))
    except BaseException as exc:  # reported to the driver, which decides
        _report(conn, exc)
        return
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            break
        if method == "stop":
            break
        try:
            conn.send(("ok", answer(trainer, method, args)))
        except BaseException as exc:  # reported to the driver, which stops every rank
            _report(conn, exc)
            break
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def _die_with_parent() -> None:
    """SIGKILL this process when the driver that started it dies (Linux's PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _report(conn: Connection, exc: BaseException) -> None:
    if isinstance(exc, ConfigError):
        kind, value = "config", exc.message
    elif isinstance(exc, TrainError):
        kind, value = "train", exc.message
    else:
        kind, value = "crash", "".join(traceback.format_exception(exc)).strip()
    with contextlib.suppress(OSError, ValueError):
        conn.send((kind, value))
