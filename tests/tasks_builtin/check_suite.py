"""Check the built-in task suite for real: untouched, every task scores 0; after its oracle, 1.

For each task directory (one holding a ``task.toml``) under ``src/sandrl/tasks/builtin``:

1. the layout and ``task.toml`` are checked (Harbor's ``version = "1.0"`` schema);
2. the starting state is built by applying ``environment/Dockerfile`` with a tiny interpreter
   (``FROM host``, ``WORKDIR``, ``COPY``, ``ADD`` of local files, ``RUN``, ``ENV``, ``ARG``, ``SHELL``)
   into a temporary root whose writable parts are ``/workspace``, ``/tmp``, ``/root`` and ``/logs``;
3. ``tests/test.sh`` runs inside bubblewrap (host ``/usr`` and ``/etc`` read-only, no network, the
   tests read-only at ``/tests``) and the reward in ``/logs/verifier/reward.txt`` must be 0;
4. on a fresh copy of the starting state, ``solution/solve.sh`` runs first (the solution read-only at
   ``/solution``, in its own sandbox), then ``tests/test.sh`` again: the reward must be 1.

This only proves the data is right; ``sandrl tasks validate`` does the same with the real sandbox
backend and image builder.

Usage: ``python tests/tasks_builtin/check_suite.py [-j JOBS] [--suite DIR] [TASK ...]``; prints one
line per task, then a summary and one JSON line. Exit status 0 when every task checks out.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "src" / "sandrl" / "tasks" / "builtin"
BWRAP = "/usr/bin/bwrap"
# Container paths the interpreter can write to; everything else is the host's, read-only.
WRITABLE = ("/workspace", "/tmp", "/root", "/logs")
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
}
SOLVE_TIMEOUT_S = 300.0


class TaskError(Exception):
    """The task's data is wrong (layout, task.toml, Dockerfile)."""


@dataclass
class Image:
    """The state a Dockerfile leaves: a root of writable dirs, the environment, the workdir."""

    root: Path
    env: dict[str, str] = field(default_factory=lambda: dict(BASE_ENV))
    workdir: str = "/"
    shell: list[str] = field(default_factory=lambda: ["/bin/sh", "-c"])

    def host_path(self, container_path: str) -> Path:
        joined = container_path if container_path.startswith("/") else f"{self.workdir}/{container_path}"
        path = os.path.normpath(joined)
        for top in WRITABLE:
            if path == top or path.startswith(top + "/"):
                return self.root / path.lstrip("/")
        raise TaskError(f"the checker only writes under {WRITABLE}, not {container_path!r}")


@dataclass
class Result:
    name: str
    ok: bool = False
    reward_without: str = "-"
    reward_with: str = "-"
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    log: str = ""


def find_tasks(suite: Path = SUITE) -> list[Path]:
    return sorted(p.parent for p in suite.glob("*/task.toml"))


def check_layout(task: Path) -> list[str]:
    problems = []
    for rel in ("instruction.md", "task.toml", "environment/Dockerfile", "tests/test.sh", "solution/solve.sh"):
        if not (task / rel).is_file():
            problems.append(f"missing {rel}")
    if problems:
        return problems
    if not (task / "instruction.md").read_text().strip():
        problems.append("empty instruction.md")
    try:
        config = tomllib.loads((task / "task.toml").read_text())
    except tomllib.TOMLDecodeError as exc:
        return [f"task.toml: {exc}"]
    if config.get("version") != "1.0":
        problems.append('task.toml: version must be "1.0"')
    meta = config.get("metadata", {})
    for key, kind in (("difficulty", str), ("category", str), ("tags", list)):
        if not isinstance(meta.get(key), kind):
            problems.append(f"task.toml: metadata.{key} missing or not a {kind.__name__}")
    if meta.get("difficulty") not in ("easy", "medium", "hard"):
        problems.append("task.toml: metadata.difficulty must be easy, medium or hard")
    for section in ("agent", "verifier"):
        if not isinstance(config.get(section, {}).get("timeout_sec"), int | float):
            problems.append(f"task.toml: {section}.timeout_sec missing")
    env = config.get("environment", {})
    for key in ("build_timeout_sec", "cpus", "memory_mb", "storage_mb"):
        if not isinstance(env.get(key), int | float):
            problems.append(f"task.toml: environment.{key} missing")
    if env.get("allow_internet") is not False:
        problems.append("task.toml: environment.allow_internet must be false")
    if env.get("workdir") != "/workspace":
        problems.append('task.toml: environment.workdir must be "/workspace"')
    return problems


def verifier_timeout(task: Path) -> float:
    config = tomllib.loads((task / "task.toml").read_text())
    return float(config["verifier"]["timeout_sec"])


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs; comments dropped, backslash continuations joined."""
    steps: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        steps.append((word.upper(), rest.strip()))
    if pending:
        raise TaskError("Dockerfile ends inside a continued line")
    return steps


def expand(value: str, env: dict[str, str]) -> str:
    for key, val in sorted(env.items(), key=lambda kv: -len(kv[0])):
        value = value.replace("${" + key + "}", val).replace("$" + key, val)
    return value


def parse_env(args: str) -> dict[str, str]:
    words = shlex.split(args)
    if len(words) >= 2 and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    out = {}
    for word in words:
        key, sep, val = word.partition("=")
        if not sep:
            raise TaskError(f"ENV/ARG needs KEY=VALUE: {args!r}")
        out[key] = val
    return out


def copy_into(src: Path, dest: Path, dest_is_dir: bool) -> None:
    if src.is_dir():
        shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
        return
    if dest_is_dir or dest.is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        dest = dest / src.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest)


def bwrap(image: Image, command: list[str], *, cwd: str, binds: list[str], timeout_s: float) -> tuple[int, str]:
    args = [BWRAP, "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for link, target in (("/bin", "usr/bin"), ("/sbin", "usr/sbin"), ("/lib", "usr/lib"), ("/lib64", "usr/lib64")):
        args += ["--symlink", target, link]
    for top in WRITABLE:
        host = image.root / top.lstrip("/")
        host.mkdir(parents=True, exist_ok=True)
        args += ["--bind", str(host), top]
    args += binds
    args += ["--dev", "/dev", "--proc", "/proc", "--unshare-all", "--die-with-parent", "--clearenv"]
    for key, val in image.env.items():
        args += ["--setenv", key, val]
    args += ["--chdir", cwd, *command]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return 124, out + f"\n[timed out after {timeout_s:.0f} s]"
    return proc.returncode, proc.stdout + proc.stderr


def build_image(task: Path, root: Path) -> Image:
    env_dir = task / "environment"
    image = Image(root=root)
    for top in WRITABLE:
        (root / top.lstrip("/")).mkdir(parents=True, exist_ok=True)
    steps = parse_dockerfile((env_dir / "Dockerfile").read_text())
    if not steps or steps[0] != ("FROM", "host"):
        raise TaskError("Dockerfile must start with FROM host")
    for instr, args in steps[1:]:
        if instr == "WORKDIR":
            image.workdir = os.path.normpath(expand(args, image.env))
            if image.workdir.startswith(WRITABLE):
                image.host_path(image.workdir).mkdir(parents=True, exist_ok=True)
        elif instr in ("ENV", "ARG"):
            image.env.update({k: expand(v, image.env) for k, v in parse_env(args).items()})
        elif instr in ("COPY", "ADD"):
            words = [w for w in shlex.split(args) if not w.startswith("--")]
            if len(words) < 2:
                raise TaskError(f"{instr} needs a source and a destination: {args!r}")
            *sources, dest = (expand(w, image.env) for w in words)
            dest_host = image.host_path(dest)
            for source in sources:
                src = (env_dir / source).resolve()
                if not src.is_relative_to(env_dir.resolve()) or not src.exists():
                    raise TaskError(f"{instr} source {source!r} is not in environment/")
                copy_into(src, dest_host, dest.endswith("/") or len(sources) > 1)
        elif instr == "RUN":
            command = [*image.shell, args] if not args.startswith("[") else json.loads(args)
            code, out = bwrap(image, command, cwd=image.workdir, binds=[], timeout_s=600)
            if code != 0:
                raise TaskError(f"RUN failed ({code}): {args}\n{out}")
        elif instr == "SHELL":
            image.shell = json.loads(args)
        elif instr == "USER":
            if args not in ("root", "0"):
                raise TaskError("the checker runs everything as root")
        else:
            raise TaskError(f"the checker does not interpret {instr}")
    return image


def read_reward(root: Path) -> str:
    path = root / "logs" / "verifier" / "reward.txt"
    return path.read_text().strip() if path.is_file() else "missing"


def run_verifier(task: Path, image: Image) -> tuple[str, str]:
    code, out = bwrap(
        image,
        ["bash", "/tests/test.sh"],
        cwd="/",
        binds=["--ro-bind", str(task / "tests"), "/tests"],
        timeout_s=verifier_timeout(task),
    )
    return read_reward(image.root), f"test.sh exit {code}\n{out}"


def check_task(task: Path, keep: bool = False) -> Result:
    result = Result(name=task.name)
    start = time.monotonic()
    result.problems = check_layout(task)
    if result.problems:
        result.seconds = time.monotonic() - start
        return result
    logs = []
    base = Path(tempfile.mkdtemp(prefix=f"sandrl-check-{task.name}-"))
    try:
        for phase in ("without", "with"):
            image = build_image(task, base / phase)
            if phase == "with":
                code, out = bwrap(
                    image,
                    ["bash", "/solution/solve.sh"],
                    cwd=image.workdir,
                    binds=["--ro-bind", str(task / "solution"), "/solution"],
                    timeout_s=SOLVE_TIMEOUT_S,
                )
                logs.append(f"--- solve.sh exit {code}\n{out}")
            reward, out = run_verifier(task, image)
            logs.append(f"--- verifier {phase} solution: reward {reward}\n{out}")
            if phase == "without":
                result.reward_without = reward
            else:
                result.reward_with = reward
    except TaskError as exc:
        result.problems.append(str(exc))
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
    if result.reward_without not in ("0", "0.0"):
        result.problems.append(f"reward without the solution is {result.reward_without}, not 0")
    if result.reward_with not in ("1", "1.0"):
        result.problems.append(f"reward with the solution is {result.reward_with}, not 1")
    result.ok = not result.problems
    result.log = "\n".join(logs)
    result.seconds = time.monotonic() - start
    return result


def check_suite(tasks: list[Path], jobs: int, verbose: bool = False) -> list[Result]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(check_task, task): task for task in tasks}
        results = []
        for future in concurrent.futures.as_completed(futures):
            res = future.result()
            results.append(res)
            mark = "ok  " if res.ok else "FAIL"
            rewards = f"without={res.reward_without:7s} with={res.reward_with:7s}"
            print(f"{mark} {res.name:40s} {rewards} {res.seconds:6.1f} s")
            for problem in res.problems:
                print(f"     {problem}")
            if verbose or not res.ok:
                print("     " + res.log.replace("\n", "\n     ")[-4000:])
            sys.stdout.flush()
    return sorted(results, key=lambda r: r.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="*", help="task names (default: all)")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--suite", type=Path, default=SUITE)
    parser.add_argument("-v", "--verbose", action="store_true", help="print every task's log")
    opts = parser.parse_args(argv)
    if not Path(BWRAP).exists():
        print(f"{BWRAP} is missing (Debian package bubblewrap)")
        return 2
    tasks = find_tasks(opts.suite)
    if opts.tasks:
        tasks = [t for t in tasks if t.name in opts.tasks]
        missing = set(opts.tasks) - {t.name for t in tasks}
        if missing:
            print(f"no such task: {', '.join(sorted(missing))}")
            return 2
    start = time.monotonic()
    results = check_suite(tasks, opts.jobs, opts.verbose)
    wall = time.monotonic() - start
    failed = [r.name for r in results if not r.ok]
    print(f"{len(results) - len(failed)}/{len(results)} tasks ok in {wall:.1f} s wall with {opts.jobs} jobs")
    summary = {
        "tasks": len(results),
        "ok": len(results) - len(failed),
        "failed": failed,
        "wall_s": round(wall, 2),
        "jobs": opts.jobs,
        "per_task_s": {r.name: round(r.seconds, 2) for r in results},
    }
    print(json.dumps(summary))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
