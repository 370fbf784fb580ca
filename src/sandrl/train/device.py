"""``[train] device`` and ``dtype`` checked against the torch that is installed, before anything is loaded.

Without the check, ``device = "cuda"`` with a CPU-only torch failed deep in ``model.to`` with a
long traceback; here it is one line naming the fix (the pip command of a CUDA build). Likewise
``dtype = "bf16"`` on a GPU without bfloat16 (before Ampere), which would otherwise fail, or crawl
through emulation, inside the first forward.
"""

from __future__ import annotations

import torch

from sandrl.errors import ConfigError

CUDA_INSTALL = (
    f"pip uninstall -y torch && pip install torch=={torch.__version__.split('+')[0]} "
    "--index-url https://download.pytorch.org/whl/cu128"
)
"""A CUDA build of the installed torch's version (CUDA 12.8 wheels; others: https://pytorch.org/get-started/locally/).
The CPU build goes first: with it installed, ``pip install torch`` only says the requirement is satisfied;
and the same version, so the ``train`` extra's pin keeps it."""


def torch_device(name: str, where: str = "[train] device") -> torch.device:
    """``name`` as a :class:`torch.device` this process can use, or a :class:`ConfigError` saying what to change."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(
            f"{where} = {name!r} is not a torch device: write cpu, cuda, cuda:N or mps (any torch device type)"
        ) from None
    if device.type == "cuda":
        _check_cuda(device, where)
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(
                f"{where} = {name!r}, but this torch has no usable MPS backend (Apple silicon, macOS 12.3+); "
                'set device = "cpu"'
            )
    elif device.type != "cpu":
        backend = getattr(torch, device.type, None)
        available = getattr(backend, "is_available", None)
        if callable(available) and not available():
            raise ConfigError(f"{where} = {name!r}, but torch {torch.__version__} has no usable {device.type} device")
    return device


def _check_cuda(device: torch.device, where: str) -> None:
    name = str(device)
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        raise ConfigError(
            f"{where} = {name!r}, but the installed torch {torch.__version__} is a CPU-only build: install a CUDA "
            f'build ({CUDA_INSTALL}) or set device = "cpu"'
        )
    if not torch.cuda.is_available():
        raise ConfigError(
            f"{where} = {name!r}, but torch {torch.__version__} sees no GPU (no driver, or CUDA_VISIBLE_DEVICES "
            'hides them; nvidia-smi shows what the driver sees): fix that, or set device = "cpu"'
        )
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ConfigError(f"{where} = {name!r}, but this machine shows {count} GPU(s): cuda:0 to cuda:{count - 1}")


BF16_CAPABILITY = (8, 0)
"""The first CUDA compute capability with native bfloat16 (Ampere: A100, A10, RTX 30xx; then L4, H100...)."""


def check_dtype(dtype: str, device: torch.device, where: str = "[train] dtype") -> None:
    """A :class:`ConfigError` naming the fix if ``dtype`` cannot be computed on ``device`` (checked by
    :func:`torch_device`). ``bf16`` is allowed on CPU (torch computes it there, slowly)."""
    if dtype != "bf16" or device.type == "cpu":
        return
    if device.type == "cuda":
        if getattr(torch.version, "hip", None) is not None:
            return  # every ROCm GPU torch supports computes bfloat16
        capability = tuple(torch.cuda.get_device_capability(device))
        if capability < BF16_CAPABILITY:
            major, minor = capability
            raise ConfigError(
                f"{where} = 'bf16', but {device} ({torch.cuda.get_device_name(device)}, compute capability "
                f"{major}.{minor}) has no bfloat16 arithmetic (it needs 8.0 or newer: A100, A10, L4, H100, "
                'RTX 30xx and later): set dtype = "fp32"'
            )
        return
    try:
        torch.zeros(1, dtype=torch.bfloat16, device=device)
    except (RuntimeError, TypeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"{where} = 'bf16', but torch {torch.__version__} cannot make a bfloat16 tensor on {device} ({reason}): "
            'set dtype = "fp32"'
        ) from None
