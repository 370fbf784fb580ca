"""Each launched engine's command line, environment and GPUs.

- ``embedded``: ``python -m sandrl.cli serve inference --model NAME --host 127.0.0.1 --port P
  --seed S --update-policy U``, its token in ``$SANDRL_INFERENCE_TOKEN`` (so weight updates are
  accepted, and the token is not on the command line for ``ps`` to show).
- ``sglang``: ``python -m sglang.launch_server --model-path NAME --host 127.0.0.1 --port P
  --api-key TOKEN --random-seed S`` (+ ``--tp-size G`` with several GPUs), with
  ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` (temperature-1 log-probs, what the trainer recomputes).
- ``vllm``: ``python -m vllm.entrypoints.openai.api_server --model NAME --host 127.0.0.1 --port P
  --seed S`` (+ ``--tensor-parallel-size G``), with ``VLLM_SERVER_DEV_MODE=1`` (its weight-reload
  routes) and its token in ``$VLLM_API_KEY``.

Each gets ``CUDA_VISIBLE_DEVICES`` = its GPUs (:func:`partition_devices`), then ``[inference] args``; an
embedded engine its share of the host's cores as ``OMP_NUM_THREADS`` (:func:`cpu_share`) unless it is set.
Engines bind loopback: only the router, in the driver on this host, talks to them (an engine actor
on another node of a Ray cluster binds its node's address, token required: :mod:`sandrl.cluster.engines`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sandrl.errors import ConfigError
from sandrl.inference.fleet.config import FleetConfig

HOST = "127.0.0.1"
MODULES = {"sglang": "sglang", "vllm": "vllm"}
"""The Python package each engine kind needs in the driver's Python."""
INSTALL = {
    "sglang": "pip install 'sglang[all]' (see SGLang's install guide for your CUDA)",
    "vllm": "pip install vllm",
}


@dataclass(frozen=True)
class EngineCommand:
    """How to start one engine: its argv, what to add to the environment, and where it will answer."""

    index: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    port: int = 0
    host: str = HOST
    """The address it binds: loopback on the driver's host; its node's address for an engine actor
    on another node of a Ray cluster (:mod:`sandrl.cluster.engines`)."""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def engine_command(
    config: FleetConfig,
    index: int,
    *,
    model: str,
    port: int,
    token: str,
    devices: Sequence[str] = (),
    seed: int = 0,
    update_policy: str = "pause",
    python: str = sys.executable,
    host: str = HOST,
) -> EngineCommand:
    """The command of engine ``index`` of ``config`` serving ``model`` on ``port`` (see the module docstring)."""
    launch, args = config.launch, list(config.args)
    env: dict[str, str] = {}
    if devices or launch != "embedded":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    if launch == "embedded":
        argv = [python, "-m", "sandrl.cli", "serve", "inference", "--model", model]
        argv += ["--host", host, "--port", str(port), "--seed", str(seed + index), "--update-policy", update_policy]
        if not _has_flag(args, "--prefix-cache-tokens"):
            argv += ["--prefix-cache-tokens", str(config.prefix_cache_tokens)]
        if config.kv_cache_tokens and not _has_flag(args, "--kv-cache-tokens"):
            argv += ["--kv-cache-tokens", str(config.kv_cache_tokens)]
        env["SANDRL_INFERENCE_TOKEN"] = token
        if "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = str(cpu_share(config.engines))
    elif launch == "sglang":
        argv = [python, "-m", "sglang.launch_server", "--model-path", model, "--host", host, "--port", str(port)]
        argv += ["--api-key", token, "--random-seed", str(seed + index)]
        if len(devices) > 1 and not _has_flag(args, "--tp-size", "--tp", "--tensor-parallel-size"):
            argv += ["--tp-size", str(len(devices))]
        env["SGLANG_RETURN_ORIGINAL_LOGPROB"] = "1"
    elif launch == "vllm":
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", host]
        argv += ["--port", str(port), "--seed", str(seed + index)]
        if len(devices) > 1 and not _has_flag(args, "--tensor-parallel-size", "-tp"):
            argv += ["--tensor-parallel-size", str(len(devices))]
        env["VLLM_SERVER_DEV_MODE"] = "1"
        env["VLLM_API_KEY"] = token
    else:
        raise ConfigError(f"[inference] launch must be one of embedded, sglang, vllm to start engines, got {launch!r}")
    return EngineCommand(index, (*argv, *args), env, port, host)


def cpu_share(engines: int) -> int:
    """The intra-op threads of each of ``engines`` embedded engines: this host's cores shared among them, as GPUs are.
    Each would take every core by default, and two engines of two OpenMP threads on two cores spin in their
    barriers waiting for a thread the other has descheduled (a 16-token prefill measured 10x slower)."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, engines))


def _has_flag(args: Sequence[str], *flags: str) -> bool:
    return any(a.split("=", 1)[0] in flags for a in args)


def check_installed(launch: str, python: str = sys.executable) -> None:
    """Refuse, naming the install, a launch whose engine is not importable in this Python."""
    module = MODULES.get(launch)
    if module is not None and importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"[inference] launch = {launch!r} starts {module} with this Python ({python}), which does not have it: "
            f"{INSTALL[launch]}, or launch = 'embedded' (sandrl's CPU engine)"
        )


def visible_devices(env: Mapping[str, str] | None = None) -> list[str]:
    """This host's GPUs as ``CUDA_VISIBLE_DEVICES`` names them: that variable when set, else 0..N-1 of CUDA's count."""
    env = os.environ if env is None else env
    said = env.get("CUDA_VISIBLE_DEVICES")
    if said is not None:
        return [d.strip() for d in said.split(",") if d.strip() and d.strip() != "-1"]
    try:
        import torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def partition_devices(config: FleetConfig, visible: Sequence[str]) -> list[tuple[str, ...]]:
    """Each engine's GPUs: ``gpus_per_engine`` each, from the end of ``visible`` (the trainer takes the first ones);
    colocated, from the start (the trainer's ranks use the same ones)."""
    per = config.gpus
    need = per * config.engines
    if need == 0:
        return [()] * config.engines
    if need > len(visible):
        raise ConfigError(
            f"[inference] engines = {config.engines} x gpus_per_engine = {per} needs {need} GPUs and this host has "
            f"{len(visible)} ({', '.join(visible) or 'none'} in CUDA_VISIBLE_DEVICES or CUDA's count): "
            "lower engines or gpus_per_engine"
        )
    free = list(visible)[:need] if config.colocate else list(visible)[len(visible) - need :]
    return [tuple(free[i * per : (i + 1) * per]) for i in range(config.engines)]
