"""Launching engines: their command lines (SGLang's and vLLM's built and checked, not run: neither is
installed here), bad input refused in one line naming the fix, a dead engine restarted, and no engine
left when the driver ends, however it ends (stand-in engine processes, :mod:`.standin_engine`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandrl.errors import ConfigError
from sandrl.inference.fleet.commands import EngineCommand, check_installed, engine_command, partition_devices
from sandrl.inference.fleet.config import FleetConfig
from sandrl.inference.fleet.launch import Launcher
from sandrl.inference.fleet.serve import engine_ports, open_fleet

HERE = Path(__file__).parent
STANDIN = HERE / "standin_engine.py"
DRIVER = HERE / "driver.py"


def test_the_router_is_spoken_to_in_the_engines_api() -> None:
    # One rule for the in-process policy (wiring.policy) and a --ray run's workers (cluster.training).
    assert FleetConfig(launch="vllm").client_api("openai") == "vllm"
    assert FleetConfig(launch="sglang").client_api("openai") == "sglang"
    assert FleetConfig(launch="embedded").client_api("vllm") == "sglang"  # the embedded engine serves SGLang's
    assert FleetConfig().client_api("openai") == "openai"  # engines started elsewhere: [model] api


def test_embedded_engines_share_the_hosts_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(16)))
    threads = [engine_command(FleetConfig(launch="embedded", engines=n), 0, model="tiny", port=9, token="s").env
               for n in (1, 3, 32)]  # fmt: skip
    assert [env["OMP_NUM_THREADS"] for env in threads] == ["16", "5", "1"]
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the user's own choice stands
    assert "OMP_NUM_THREADS" not in engine_command(FleetConfig(launch="embedded"), 0, model="t", port=9, token="s").env


def test_sglang_and_vllm_engines_get_their_own_command_lines() -> None:
    sglang = FleetConfig(launch="sglang", engines=2, gpus_per_engine=2, args=("--mem-fraction-static", "0.8"))
    devices = partition_devices(sglang, ["0", "1", "2", "3", "4"])
    assert devices == [("1", "2"), ("3", "4")]  # the last ones: the first is the trainer's
    colocated = FleetConfig(launch="sglang", engines=2, gpus_per_engine=2, colocate=True)
    assert partition_devices(colocated, ["0", "1", "2", "3", "4"]) == [("0", "1"), ("2", "3")]  # shared with it
    command = engine_command(sglang, 1, model="/ckpt", port=31001, token="t" * 32, devices=devices[1], seed=7)
    assert command.argv[1:] == (
        "-m", "sglang.launch_server", "--model-path", "/ckpt", "--host", "127.0.0.1", "--port", "31001",
        "--api-key", "t" * 32, "--random-seed", "8", "--tp-size", "2", "--mem-fraction-static", "0.8",
    )  # fmt: skip
    assert command.env == {"CUDA_VISIBLE_DEVICES": "3,4", "SGLANG_RETURN_ORIGINAL_LOGPROB": "1"}
    vllm = FleetConfig(launch="vllm", args=("--tensor-parallel-size", "1"))
    command = engine_command(vllm, 0, model="/ckpt", port=8000, token="k" * 32, devices=("0", "1"))
    assert command.argv[1:] == (
        "-m", "vllm.entrypoints.openai.api_server", "--model", "/ckpt", "--host", "127.0.0.1", "--port", "8000",
        "--seed", "0", "--tensor-parallel-size", "1",
    )  # fmt: skip
    assert command.env == {"CUDA_VISIBLE_DEVICES": "0,1", "VLLM_SERVER_DEV_MODE": "1", "VLLM_API_KEY": "k" * 32}
    embedded = engine_command(FleetConfig(launch="embedded"), 0, model="tiny", port=9, token="s" * 32)
    assert "--api-key" not in embedded.argv and embedded.env["SANDRL_INFERENCE_TOKEN"] == "s" * 32
    assert embedded.argv[-2:] == ("--prefix-cache-tokens", "32768")  # [inference] prefix_cache_tokens
    off = engine_command(FleetConfig(launch="embedded", prefix_cache_tokens=0), 0, model="tiny", port=9, token="s")
    assert off.argv[-2:] == ("--prefix-cache-tokens", "0")
    own = FleetConfig(launch="embedded", args=("--prefix-cache-tokens", "7"))
    argv = engine_command(own, 0, model="tiny", port=9, token="s").argv
    assert argv.count("--prefix-cache-tokens") == 1 and argv[-1] == "7"  # args say it: theirs alone
    with pytest.raises(ConfigError, match="prefix_cache_tokens must be >= 0"):
        FleetConfig(prefix_cache_tokens=-1)


@pytest.mark.parametrize(
    ("config", "fix"),
    [
        (dict(launch="embedded", engines=0), "set engines = 1 or more"),
        (dict(launch="sglang", args=("--port", "9")), "drop it (set [inference] port for fixed ports)"),
        (dict(launch="embedded", gpus_per_engine=1), "drop gpus_per_engine"),
        (dict(launch="tgi"), "launch must be one of embedded, sglang, vllm"),
    ],
)
def test_bad_settings_are_one_line_naming_the_fix(config: dict[str, object], fix: str) -> None:
    with pytest.raises(ConfigError) as caught:
        FleetConfig(**config)  # type: ignore[arg-type]
    assert fix in caught.value.message and "\n" not in caught.value.message


def test_engines_that_need_more_gpus_than_the_host_has_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"needs 4 GPUs and this host has 2 \(0, 1 in"):
        partition_devices(FleetConfig(launch="vllm", engines=2, gpus_per_engine=2), ["0", "1"])


@pytest.mark.parametrize("launch", ["sglang", "vllm"])
def test_an_engine_this_python_lacks_is_named_with_its_install(launch: str) -> None:
    if __import__("importlib").util.find_spec(launch) is not None:
        pytest.skip(f"{launch} is installed here")
    with pytest.raises(ConfigError, match=f"launch = '{launch}' starts {launch} with this Python .* pip install"):
        check_installed(launch)


async def test_a_port_in_use_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as caught:
            async with open_fleet(FleetConfig(launch="embedded", port=port), model="tiny", log_dir=tmp_path):
                pass
    assert f"port {port} (inference engine 0) is in use" in caught.value.message
    assert "set [inference] port to another first port (0: sandrl picks free ones)" in caught.value.message
    assert not (tmp_path / "engine-0.log").exists()


async def test_an_engine_that_exits_at_once_fails_the_start_with_its_log(tmp_path: Path) -> None:
    config = FleetConfig(launch="embedded", args=("--no-such-flag",), startup_timeout_s=120)
    with pytest.raises(ConfigError) as caught:
        async with open_fleet(config, model="tiny", log_dir=tmp_path):
            pass
    first, *tail = caught.value.message.splitlines()
    assert first.startswith("inference engine 0 exited with status 2 before it answered")
    assert f"fix the engine's command ([inference] launch, args, [model] name) by its log {tmp_path}" in first
    assert any("No such option: --no-such-flag" in line for line in tail)


async def test_a_dead_engine_is_restarted_then_given_up_on(tmp_path: Path) -> None:
    port = engine_ports(FleetConfig(engines=1))[0]
    lost: list[str] = []
    gone: list[int] = []
    command = EngineCommand(0, (sys.executable, str(STANDIN), "--port", str(port)), {}, port)
    launcher = Launcher(
        [command],
        tmp_path,
        startup_timeout_s=30,
        max_restarts=1,
        on_lost=lambda i, why: lost.append(why),
        on_gone=gone.append,
    )
    await launcher.start()
    try:
        first = engine_pid(launcher)
        os.kill(first, signal.SIGKILL)
        async with asyncio.timeout(20):
            while launcher.restarts() != [1] or not await healthy(command.url):
                await asyncio.sleep(0.05)
        assert lost == ["its process exited with status 137"] and engine_pid(launcher) != first
        assert "--- sandrl: restarting (1) engine 0" in (tmp_path / "engine-0.log").read_text()
        os.kill(engine_pid(launcher), signal.SIGKILL)
        async with asyncio.timeout(20):
            while not gone:
                await asyncio.sleep(0.05)
        assert gone == [0] and launcher.restarts() == [1]
    finally:
        launcher.stop()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_no_engine_outlives_the_driver(signum: int, tmp_path: Path) -> None:
    ports = engine_ports(FleetConfig(engines=2))
    driver = subprocess.Popen(
        [sys.executable, str(DRIVER), str(tmp_path), *map(str, ports)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert driver.stdout is not None
        guards = json.loads(driver.stdout.readline())["guards"]
        engines = [pid for g in guards for pid in children(g)]
        grandchildren = [pid for e in engines for pid in children(e)]
        assert len(engines) == 2 and len(grandchildren) == 2  # each stand-in runs a worker of its own
        driver.send_signal(signum)
        driver.wait(timeout=30)
        deadline = time.monotonic() + 15
        while any(map(alive, guards + engines + grandchildren)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in guards + engines + grandchildren if alive(pid)] == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            driver.kill()
        driver.communicate()


def engine_pid(launcher: Launcher) -> int:
    guard = launcher.engines[0].process
    assert guard is not None
    deadline = time.monotonic() + 10
    while not (found := children(guard.pid)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return found[0]


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


async def healthy(url: str) -> bool:
    import httpx

    try:
        async with httpx.AsyncClient() as http:
            return (await http.get(url + "/health", timeout=1)).status_code == 200
    except httpx.HTTPError:
        return False


def test_an_interrupted_stop_still_closes_the_engines_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandrl.inference.fleet import launch

    engine = launch.EngineProcess(EngineCommand(0, ("true",)), tmp_path / "engine-0.log")
    engine.start()
    log = engine._log
    assert log is not None and not log.closed

    def interrupted(process: subprocess.Popen[bytes], grace_s: float) -> None:
        process.kill()
        process.wait()
        raise KeyboardInterrupt  # Ctrl-C while the stop waited for the guard

    monkeypatch.setattr(launch, "stop_process", interrupted)
    with pytest.raises(KeyboardInterrupt):
        engine.stop()
    assert log.closed
