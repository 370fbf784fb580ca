"""``sandrl demo sandbox``: one sandbox, its commands, files and enforced limits.

Create a sandbox, run commands in it, move files in and out, show its limits being enforced,
and close it without a trace.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from sandrl.sandbox.base import ExecResult, SandboxSpec
from sandrl.sandbox.bwrap.inventory import traces
from sandrl.wiring.runner import local_provider


def _show(console: Console, title: str, result: ExecResult) -> None:
    lines = (result.stdout + result.stderr).rstrip().splitlines() or ["(no output)"]
    if len(lines) > 8:
        lines = [*lines[:4], f"... ({len(lines) - 6} more lines) ...", *lines[-2:]]
    body = "\n".join(lines)
    flags = []
    if result.timed_out:
        flags.append("timed out")
    if result.truncated:
        flags.append("output truncated")
    extra = f", {', '.join(flags)}" if flags else ""
    console.print(
        Panel(
            Text(body),  # the sandbox's output, printed as it came
            title=f"{escape(title)}  [dim]exit {result.exit_code}, {result.duration_s * 1000:.1f} ms{extra}[/]",
        )
    )


async def run_demo(console: Console) -> None:
    provider = local_provider()
    spec = SandboxSpec(cpus=0.5, memory_mb=128, pids=64, disk_mb=64, ttl_s=120)
    console.rule("[bold]sandrl sandbox demo")
    t = time.perf_counter()
    sandbox = await provider.create(spec)
    console.print(
        f"created [bold]{escape(sandbox.id)}[/] in {(time.perf_counter() - t) * 1000:.1f} ms "
        f"(cpus={spec.cpus}, memory={spec.memory_mb} MiB, pids={spec.pids}, disk={spec.disk_mb} MiB, no network)"
    )
    async with sandbox:
        _show(console, "who and where", await sandbox.exec("id; hostname; pwd; ps -e --no-headers | wc -l"))
        await sandbox.write_file("hello.py", b"import sys\nprint('hello from', sys.version.split()[0])\n")
        _show(console, "a file written in, then run", await sandbox.exec("python3 hello.py"))
        await sandbox.exec('python3 -c "print(sum(range(10**6)))" > result.txt')
        data = await sandbox.read_file("result.txt")
        console.print(f"read back result.txt: {data.decode().strip()}")
        _show(
            console,
            "state persists: a background server, then a client",
            await sandbox.exec(
                "nohup python3 -m http.server 8000 >/tmp/http.log 2>&1 & sleep 0.5; "
                "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000').status)\""
            ),
        )
        _show(console, "the host's secrets are not there", await sandbox.exec("cat /etc/shadow; ls /home /root"))
        _show(console, "no network but loopback", await sandbox.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1"))
        _show(
            console,
            "memory limit: a 512 MiB allocation",
            await sandbox.exec("python3 -c \"b = bytearray(512 << 20); print('allocated')\""),
        )
        _show(
            console,
            "pids limit: a fork bomb, stopped by a 2 s timeout",
            await sandbox.exec("sleep 10 & s=$!; bomb() { bomb | bomb & }; bomb; wait $s", timeout_s=2),
        )
        _show(console, "and the sandbox is still fine", await sandbox.exec("echo alive; ps -e --no-headers | wc -l"))
        _show(
            console, "disk limit: writing 100 MiB", await sandbox.exec("dd if=/dev/zero of=/tmp/fill bs=1M count=100")
        )
        _show(console, "time limit: sleep 30 with a 1 s timeout", await sandbox.exec("sleep 30", timeout_s=1))
        flood = await sandbox.exec("head -c 5000000 /dev/zero | tr '\\0' x")
        console.print(
            f"output cap: 5 MB printed, {len(flood.stdout):,} bytes kept, truncated={flood.truncated}, "
            f"exit {flood.exit_code}"
        )
        stats = sandbox.stats()
        console.print(
            f"usage: {stats.cpu_s:.2f} CPU-s, peak memory {stats.memory_peak_bytes / 2**20:.1f} MiB, "
            f"{stats.oom_kills} OOM kill(s)"
        )
    # Its own sandbox only: other runs sharing the state directory have theirs, live.
    left = traces(provider.state, provider.cgroups, [(sandbox.id, sandbox.uid)])
    console.print(f"closed {escape(sandbox.id)}; left behind: {escape(left.describe())}")
