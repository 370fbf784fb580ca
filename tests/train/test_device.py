"""``[train] device`` against the installed torch: what cannot work is one line naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from sandrl.cli import app
from sandrl.errors import ConfigError
from sandrl.train.config import TrainConfig
from sandrl.train.device import CUDA_INSTALL, check_dtype, torch_device

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


def _a_cuda_host(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], name: str) -> None:
    """The edge faked: a CUDA build of torch and what the driver reports of one GPU."""
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


def test_bf16_on_a_gpu_without_bfloat16_is_one_line_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _a_cuda_host(monkeypatch, (7, 0), "Tesla V100-SXM2-16GB")
    config = tmp_path / "run.toml"
    config.write_text(f'[run]\noutput_dir = "{tmp_path / "out"}"\n[tasks]\nfamily = "echo"\n')
    result = CliRunner().invoke(app, ["train", str(config), "--set", "train.device=cuda", "--set", "train.dtype=bf16"])
    assert isinstance(result.exception, ConfigError), result.output
    message = result.exception.message
    assert message == (
        "[train] dtype = 'bf16', but cuda (Tesla V100-SXM2-16GB, compute capability 7.0) has no bfloat16 "
        'arithmetic (it needs 8.0 or newer: A100, A10, L4, H100, RTX 30xx and later): set dtype = "fp32"'
    )
    assert not (tmp_path / "out").exists()  # checked before the run writes anything


def test_bf16_is_allowed_on_cpu_and_on_a_gpu_that_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    check_dtype("bf16", torch_device("cpu"))
    check_dtype("fp32", torch_device("cpu"))
    _a_cuda_host(monkeypatch, (9, 0), "NVIDIA H100 80GB HBM3")
    check_dtype("bf16", torch_device("cuda:0"))
    _a_cuda_host(monkeypatch, (7, 5), "Tesla T4")
    check_dtype("fp32", torch_device("cuda:0"))  # fp32 needs nothing
    with pytest.raises(ConfigError, match=r"cuda:0 \(Tesla T4, compute capability 7\.5\)"):
        check_dtype("bf16", torch_device("cuda:0"))


def test_the_cuda_install_command_replaces_the_cpu_build_with_the_same_version() -> None:
    # `pip install torch --index-url ...` where the CPU build is installed only answers "Requirement already
    # satisfied", and an unpinned one would be replaced by the train extra's pin at the next `make setup`.
    remove, install = CUDA_INSTALL.split(" && ")
    assert remove == "pip uninstall -y torch"
    assert f"torch=={torch.__version__.split('+')[0]}" in install.split()
    assert "--index-url https://download.pytorch.org/whl/cu128" in install
