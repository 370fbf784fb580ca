"""``[train] device`` against the installed torch: what cannot work is one line naming the fix."""

from __future__ import annotations

import pytest
import torch

from sandrl.errors import ConfigError
from sandrl.train.config import TrainConfig
from sandrl.train.device import CUDA_INSTALL, torch_device

from .helpers import make_trainer


def test_cpu_is_always_usable() -> None:
    assert torch_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.version.cuda is not None, reason="this torch is a CUDA build")
def test_cuda_on_a_cpu_only_torch_names_the_pip_command() -> None:
    with pytest.raises(ConfigError) as info:
        torch_device("cuda:1")
    assert "is a CPU-only build" in info.value.message and CUDA_INSTALL in info.value.message
    assert "\n" not in info.value.message


def test_a_cuda_build_without_a_gpu_or_with_fewer_gpus_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # The edge faked: what the driver reports. A CUDA build of torch on a host without a GPU...
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"sees no GPU .*CUDA_VISIBLE_DEVICES"):
        torch_device("cuda")
    # ... and on one with two GPUs, asked for the fourth.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"'cuda:3', but this machine shows 2 GPU\(s\): cuda:0 to cuda:1"):
        torch_device("cuda:3")


def test_the_trainer_checks_its_device_before_moving_the_model() -> None:
    with pytest.raises(ConfigError, match="is not a torch device"):
        make_trainer(TrainConfig(device="gpu0"))
