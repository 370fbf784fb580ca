"""``[inference]``: inference engines that sandrl starts itself, one router in front of them.

.. code-block:: toml

    [inference]                 # FleetConfig
    launch = "sglang"           # or "vllm", or "embedded" (sandrl's CPU engine, one process each)
    engines = 4
    gpus_per_engine = 2         # each engine's share of this host's GPUs (CUDA_VISIBLE_DEVICES)
    args = ["--mem-fraction-static", "0.8"]   # passed through to each engine's command line
    kv_admission = true         # model calls wait for the engines' KV room (no retraction storms)

Without ``launch`` the policy is what ``[model] inference`` says: the in-process engine, or the
URL (or ``URL,URL,...``) of engines started elsewhere. With it, sandrl starts ``engines`` engines
on this host, each on its own port and GPUs, logging to ``<output_dir>/engines/engine-N.log``;
waits until each answers ``/health``; restarts one that dies (at most ``max_restarts`` times,
waiting 1, 2, 4... up to 30 s between tries) and loads the trainer's current weights into it
before it serves again; and stops them all when the run ends, on Ctrl-C, and when the driver is
killed (:mod:`sandrl.inference.fleet.guard`). The run samples through one router
(:mod:`sandrl.inference.fleet.proxy`) that keeps each episode on one engine. Under ``--ray`` each engine
is a Ray actor running that same command, in one placement group, behind the driver's router
(:mod:`sandrl.cluster.engines`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sandrl.errors import ConfigError


@dataclass(frozen=True)
class AdmissionConfig:
    """How model calls wait for the engines' room (``[inference] kv_admission_*``; the gate:
    :class:`~sandrl.inference.kv_admission.KVAdmission`)."""

    max_queued: int = 0
    """Requests the engines may hold in their queues (batch full) before calls wait here instead."""
    interval_s: float = 0.5
    """At most one reading of the engines per interval, shared by every call."""
    max_wait_s: float = 600.0
    """Longest one call waits; then it goes anyway (counted in ``timeouts``)."""

    def __post_init__(self) -> None:
        if isinstance(self.max_queued, bool) or not isinstance(self.max_queued, int) or self.max_queued < 0:
            raise ConfigError(f"kv_admission_max_queued must be a whole number >= 0, got {self.max_queued!r}")
        if not (math.isfinite(self.interval_s) and 0.01 <= self.interval_s <= 60):
            raise ConfigError(f"kv_admission_interval_s must be between 0.01 and 60 seconds, got {self.interval_s!r}")
        if not (math.isfinite(self.max_wait_s) and self.max_wait_s > 0):
            raise ConfigError(f"kv_admission_max_wait_s must be a positive number of seconds, got {self.max_wait_s!r}")


LAUNCHES = ("embedded", "sglang", "vllm")
WEIGHT_SYNCS = ("auto", "broadcast", "disk")
"""What ``launch`` may name: sandrl's own server (``sandrl serve inference``), SGLang, vLLM."""
SET_BY_SANDRL = ("--host", "--port", "--model", "--model-path", "--api-key")
"""Engine flags sandrl sets itself; ``args`` may not repeat them."""


@dataclass(frozen=True)
class FleetConfig:
    """Inference engines that sandrl starts on this host for the run (under ``--ray``: as Ray actors in a
    placement group, :mod:`sandrl.cluster.engines`; logs in ``<output_dir>/engines/``),
    restarts when one dies and stops with the run, behind one router that keeps each episode on one
    engine (:mod:`sandrl.inference.fleet`). Without ``launch`` nothing is started."""

    launch: str = ""
    """``embedded`` (``sandrl serve inference``, on CPU), ``sglang`` (``python -m sglang.launch_server``)
    or ``vllm`` (vLLM's OpenAI server, with ``VLLM_SERVER_DEV_MODE=1`` for weight reloads), each
    started with this Python. Empty: nothing is launched; ``[model] inference`` says where the policy is."""
    engines: int = 1
    """How many engines to start; each serves the whole model (data parallel)."""
    gpus_per_engine: int | None = None
    """GPUs each engine gets (set as its ``CUDA_VISIBLE_DEVICES``; with more than one, SGLang gets
    ``--tp-size`` and vLLM ``--tensor-parallel-size`` unless ``args`` says). The engines take the
    last ``engines x gpus_per_engine`` of this host's GPUs, leaving the first ones to the trainer.
    Default: 1 for sglang and vllm, none for embedded (a CPU engine)."""
    args: tuple[str, ...] = ()
    """More command-line arguments for every engine, passed through as they are (``--host``,
    ``--port``, the model and the API key are sandrl's to set)."""
    port: int = 0
    """The first engine's port, the next ones after it; 0: free ports of this host are chosen."""
    startup_timeout_s: float = 900.0
    """Longest wait for an engine to answer ``/health`` after it starts (a large model loads for minutes)."""
    max_restarts: int = 3
    """Restarts of one engine that died before it is given up on (the run goes on with the others)."""
    prefix_cache_tokens: int = 32768
    """The embedded engine's prefix cache, in tokens (the KV of recent sequences, reused when the
    next turn of an episode extends one; emptied on every weight update); 0 turns it off. For the
    in-process engine (``[model] inference = "embedded"``) and the engines of ``launch =
    "embedded"``; SGLang and vLLM keep their own (their flags go in ``args``)."""

    weight_sync: str = "auto"
    """How the trainer's new weights reach the engines: ``broadcast`` (over a process group with every
    engine, SGLang's ``/update_weights_from_distributed``: NCCL between GPUs, gloo on CPU, shared
    memory for sandrl's engines on the trainer's host; no file is written), ``disk`` (a checkpoint
    each engine reads: ``/update_weights_from_disk``), or ``auto``:
    broadcast to engines that speak it (sandrl's and SGLang's) from a one-process trainer of full
    weights, the disk otherwise (vLLM, LoRA adapters, a trainer of several ranks) and whenever a
    broadcast fails (an engine died mid-push: the next push forms the group again)."""
    colocate: bool = False
    """The engines share the trainer's GPUs: before each train step they release their KV cache and weights,
    and after it they take them back, the new weights loaded in between (:mod:`sandrl.inference.colocation`;
    SGLang's ``/release_memory_occupation``, vLLM's ``/sleep``). Needs the sync driver: nothing is generated
    while the trainer trains."""
    weight_bucket_mb: int = 256
    """The size of one broadcast bucket: the trainer holds one bucket of full tensors at a time."""
    kv_cache_tokens: int = 0
    """The embedded engine's KV cache for its running requests, in tokens (SGLang's ``--max-total-tokens``): a
    request is admitted while its context fits, and the newest running requests are retracted (prefilled again
    later) when decoding runs out of room; 0: no bound. For the in-process engine and the engines of ``launch =
    "embedded"``; SGLang and vLLM size theirs from GPU memory (their flags go in ``args``)."""

    kv_admission: bool = False
    """Each model call waits until the engines have KV room for its prompt and ``max_new_tokens``, and no more
    than ``kv_admission_max_queued`` requests would queue there, so a burst of episodes waits here instead of
    making the engines retract (:mod:`sandrl.inference.kv_admission`; the wait is each trajectory's
    ``timings.kv_wait_s``). The engines' load is read at most once per ``kv_admission_interval_s`` from SGLang's
    ``/v1/loads`` (sandrl's engines and router answer it) or vLLM's ``/metrics``; engines that report neither
    (an OpenAI-compatible server, an SGLang without ``/v1/loads``) take calls as without it."""
    kv_admission_max_queued: int = 0
    """With ``kv_admission``: requests the engines may hold queued (their batch full) before calls wait instead."""
    kv_admission_interval_s: float = 0.5
    """With ``kv_admission``: at most one reading of the engines' load per this many seconds, for all episodes."""
    kv_admission_max_wait_s: float = 600.0
    """With ``kv_admission``: the longest one model call waits for room; then it goes anyway."""

    def __post_init__(self) -> None:
        if self.weight_sync not in WEIGHT_SYNCS:
            raise ConfigError(f"weight_sync must be one of {', '.join(WEIGHT_SYNCS)}, got {self.weight_sync!r}")
        if self.weight_bucket_mb < 1:
            raise ConfigError(f"weight_bucket_mb must be >= 1, got {self.weight_bucket_mb}")
        if not isinstance(self.kv_admission, bool):
            raise ConfigError(f"kv_admission must be true or false, got {self.kv_admission!r}")
        if isinstance(self.kv_cache_tokens, bool) or self.kv_cache_tokens < 0:
            raise ConfigError(f"kv_cache_tokens must be >= 0 (0: no bound), got {self.kv_cache_tokens!r}")
        self.admission_config()  # a bad kv_admission_* value fails here, named, whether or not it is on
        if self.launch and self.launch not in LAUNCHES:
            raise ConfigError(f"launch must be one of {', '.join(LAUNCHES)} (or left out), got {self.launch!r}")
        if self.engines < 1:
            raise ConfigError(
                f"engines must be >= 1, got {self.engines}: set engines = 1 or more, or drop [inference] launch "
                "to sample in-process ([model] inference = 'embedded') or from engines started elsewhere "
                "([model] inference = 'http://HOST:PORT,http://HOST:PORT')"
            )
        if self.prefix_cache_tokens < 0:
            raise ConfigError(
                f"prefix_cache_tokens must be >= 0 (0 turns the prefix cache off), got {self.prefix_cache_tokens}"
            )
        if self.gpus_per_engine is not None and self.gpus_per_engine < 0:
            raise ConfigError(f"gpus_per_engine must be >= 0, got {self.gpus_per_engine}")
        if self.launch == "embedded" and self.gpus_per_engine:
            raise ConfigError(
                "launch = 'embedded' runs sandrl's CPU engine, which takes no GPU: drop gpus_per_engine, "
                "or launch = 'sglang' or 'vllm' to serve on GPUs"
            )
        if not 0 <= self.port <= 65535 - self.engines + 1:
            raise ConfigError(f"port must be 0 (free ports) or the first of {self.engines} free ports, got {self.port}")
        if not (math.isfinite(self.startup_timeout_s) and self.startup_timeout_s > 0):
            raise ConfigError(f"startup_timeout_s must be a positive number of seconds, got {self.startup_timeout_s!r}")
        if self.max_restarts < 0:
            raise ConfigError(f"max_restarts must be >= 0, got {self.max_restarts}")
        for arg in self.args:
            flag = arg.split("=", 1)[0]
            if flag in SET_BY_SANDRL:
                raise ConfigError(
                    f"args holds {flag}, which sandrl sets for each engine: drop it"
                    + (" (set [inference] port for fixed ports)" if flag == "--port" else "")
                )

    def admission_config(self) -> AdmissionConfig:
        """The ``kv_admission_*`` settings, checked."""
        return AdmissionConfig(
            max_queued=self.kv_admission_max_queued,
            interval_s=self.kv_admission_interval_s,
            max_wait_s=self.kv_admission_max_wait_s,
        )

    @property
    def launched(self) -> bool:
        """Whether sandrl starts the engines."""
        return bool(self.launch)

    def client_api(self, attached: str) -> str:
        """The API a client speaks to the fleet's router: the launched engines' (vLLM's own; SGLang's for
        SGLang and the embedded engine), else ``attached``, the ``[model] api`` of engines started elsewhere."""
        return "vllm" if self.launch == "vllm" else "sglang" if self.launched else attached

    @property
    def gpus(self) -> int:
        """Each engine's GPUs, the default resolved."""
        if self.gpus_per_engine is not None:
            return self.gpus_per_engine
        return 0 if self.launch == "embedded" else 1
