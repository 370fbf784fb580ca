"""A driver for the orphan tests: two stand-in engines under a :class:`Launcher`, then it waits.

``python driver.py LOG_DIR PORT0 PORT1`` prints one JSON line (its guards' pids) once the engines
answer, then runs until a signal stops it, through :func:`sandrl.interrupt.run` as ``sandrl train``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from sandrl import interrupt
from sandrl.inference.fleet.commands import EngineCommand
from sandrl.inference.fleet.launch import Launcher

STANDIN = Path(__file__).with_name("standin_engine.py")


async def main(log_dir: Path, ports: list[int]) -> None:
    commands = [
        EngineCommand(i, (sys.executable, str(STANDIN), "--port", str(p), "--child"), {}, p)
        for i, p in enumerate(ports)
    ]
    launcher = Launcher(commands, log_dir, startup_timeout_s=30, max_restarts=0)
    await launcher.start()
    try:
        guards = [e.process.pid for e in launcher.engines if e.process is not None]
        print(json.dumps({"guards": guards}), flush=True)
        await asyncio.Event().wait()
    finally:
        launcher.stop()


if __name__ == "__main__":
    try:
        interrupt.run(main(Path(sys.argv[1]), [int(p) for p in sys.argv[2:]]))
    except interrupt.Interrupted as stop:
        sys.exit(stop.exit_code)
