"""Seeded families of tiny parametrised tasks, in the Harbor task format, for training demos.

A family is a task template with a few parameters ("write the word W into answer.txt", "write the
sum of A and B"), simple enough for a very small model to learn within a short GRPO run. Its
parameters come from a ``random.Random`` seeded with the family name and the seed, so the same
``(family, n, seed)`` always writes byte-identical directories (names, contents and modes).

Every task asks for one answer in ``/workspace/answer.txt``; its verifier compares the file,
surrounding whitespace ignored, with the expected answer, which lives in ``tests/`` and so is
only in the sandbox at verify time. The oracle (``solution/solve.sh``) computes the answer with
shell tools rather than pasting it.

    >>> from sandrl.tasks.builtin.generated import generate_tasks
    >>> dirs = generate_tasks("/tmp/toy", "arith", n=64, seed=0)

Families: ``echo`` (write a word), ``arith`` (the sum of two integers), ``reverse`` (a word
spelled backwards), ``count`` (how many lines of a given file are a given word) and ``lines``
(the lines of a given file sorted, reversed, upper-cased, cut or counted: one of eleven
coreutils commands, chosen by what the instruction asks for; the skill carries over to any file).
"""

from __future__ import annotations

import os
import random
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FAMILIES", "ToyTask", "generate_tasks", "make_task"]

_WORDS = (
    "amber",
    "apple",
    "arrow",
    "badge",
    "basil",
    "beach",
    "berry",
    "birch",
    "blaze",
    "bloom",
    "brick",
    "brook",
    "cabin",
    "camel",
    "candle",
    "canyon",
    "cedar",
    "cherry",
    "cider",
    "cliff",
    "cloud",
    "clover",
    "cobalt",
    "comet",
    "coral",
    "cotton",
    "crane",
    "crystal",
    "daisy",
    "delta",
    "desert",
    "dune",
    "eagle",
    "ember",
    "falcon",
    "fern",
    "fiddle",
    "flint",
    "forest",
    "fossil",
    "garnet",
    "ginger",
    "glacier",
    "granite",
    "harbor",
    "hazel",
    "heron",
    "honey",
    "island",
    "ivory",
    "jasper",
    "juniper",
    "kettle",
    "lagoon",
    "lantern",
    "lemon",
    "lily",
    "linen",
    "lotus",
    "maple",
    "marble",
    "meadow",
    "mint",
    "moss",
    "nectar",
    "oasis",
    "ocean",
    "olive",
    "onyx",
    "orchid",
    "otter",
    "pearl",
    "pebble",
    "pepper",
    "pine",
    "plum",
    "poppy",
    "quartz",
    "quill",
    "raven",
    "reef",
    "ridge",
    "river",
    "robin",
    "saffron",
    "sage",
    "salmon",
    "sierra",
    "silver",
    "spruce",
    "storm",
    "summit",
    "swan",
    "thistle",
    "thunder",
    "tiger",
    "topaz",
    "tulip",
    "valley",
    "velvet",
    "violet",
    "walnut",
    "willow",
    "winter",
    "zephyr",
)

_TEST_SH = """#!/bin/bash
# Verifier: reward 1 when /workspace/answer.txt holds the expected answer (surrounding whitespace
# ignored); with PARTIAL_CREDIT a wrong answer earns up to 0.5 for its closeness (edit distance).
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
python3 - <<'PY'
from pathlib import Path

PARTIAL_CREDIT = {partial_credit}


def similarity(a: str, b: str) -> float:
    # 1 - Levenshtein distance / the longer length.
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return 1 - previous[-1] / max(len(a), len(b), 1)


answer = Path("/workspace/answer.txt")
expected = Path("/tests/expected.txt").read_text().strip()
got = answer.read_bytes().decode("utf-8", "replace").strip() if answer.is_file() else None
if got == expected:
    reward = "1"
elif got and PARTIAL_CREDIT:
    reward = f"{{0.5 * similarity(got[:200], expected):.4f}}"
else:
    reward = "0"
Path("/logs/verifier/reward.txt").write_text(reward + "\\n")
PY
"""

_TASK_TOML = """version = "1.0"

[metadata]
author_name = "sandrl"
author_email = "sandrl@example.invalid"
difficulty = "easy"
category = "toy"
tags = [{tags}]

[agent]
timeout_sec = 60.0

[verifier]
timeout_sec = 30.0

[environment]
build_timeout_sec = 60.0
cpus = 1
memory_mb = 512
storage_mb = 256
allow_internet = false
workdir = "/workspace"
"""


@dataclass(frozen=True)
class ToyTask:
    """One generated task, before it is written out."""

    name: str
    instruction: str
    answer: str
    solve: str
    """The body of ``solution/solve.sh`` (after the shebang and ``set -euo pipefail``)."""
    files: Mapping[str, str] = field(default_factory=dict)
    """Starting files of ``/workspace``: relative path to content."""
    tags: tuple[str, ...] = ()
    partial_credit: bool = False
    """A wrong answer earns up to 0.5 reward for its closeness to the right one (edit distance), so a
    group of attempts that all fail still tells GRPO which came nearest. Only where closeness means
    something (a word, not a number); ``passed`` stays exact (reward 1)."""


def _echo(rng: random.Random, name: str) -> ToyTask:
    word = rng.choice(_WORDS)
    return ToyTask(
        name=name,
        instruction=f"Write the word `{word}` into the file `/workspace/answer.txt`.\n",
        answer=word,
        solve=f"printf '%s\\n' {word} > /workspace/answer.txt\n",
        tags=("echo",),
        partial_credit=True,
    )


def _arith(rng: random.Random, name: str) -> ToyTask:
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    return ToyTask(
        name=name,
        instruction=(f"Write the sum of {a} and {b}, as a decimal number, into the file `/workspace/answer.txt`.\n"),
        answer=str(a + b),
        solve=f"echo $(({a} + {b})) > /workspace/answer.txt\n",
        tags=("arith",),
    )


def _reverse(rng: random.Random, name: str) -> ToyTask:
    word = rng.choice(_WORDS)
    return ToyTask(
        name=name,
        instruction=(
            f"Write the word `{word}` spelled backwards (last letter first) into the file `/workspace/answer.txt`.\n"
        ),
        answer=word[::-1],
        solve=f"printf '%s\\n' {word} | rev > /workspace/answer.txt\n",
        tags=("reverse",),
        partial_credit=True,
    )


def _count(rng: random.Random, name: str) -> ToyTask:
    vocabulary = rng.sample(_WORDS, 4)
    target = vocabulary[0]
    lines = [rng.choice(vocabulary) for _ in range(rng.randint(5, 30))]
    return ToyTask(
        name=name,
        instruction=(
            "The file `/workspace/words.txt` has one word per line. Write the number of lines that are "
            f"exactly the word `{target}` into the file `/workspace/answer.txt`.\n"
        ),
        answer=str(lines.count(target)),
        solve=f"grep -c -x {target} /workspace/words.txt > /workspace/answer.txt || true\n",
        files={"words.txt": "\n".join(lines) + "\n"},
        tags=("count",),
    )


_LINE_TOOLS: tuple[tuple[str, str, Callable[[list[str]], list[str]]], ...] = (
    # What to write, the command that writes it, and the lines it gives (as GNU coreutils do in C.UTF-8).
    ("its lines sorted in alphabetical order", "sort {f}", sorted),
    ("its lines sorted in reverse alphabetical order", "sort -r {f}", lambda xs: sorted(xs, reverse=True)),
    ("its lines sorted in alphabetical order with duplicates removed", "sort -u {f}", lambda xs: sorted(set(xs))),
    ("its lines in reverse order (last line first)", "tac {f}", lambda xs: xs[::-1]),
    ("its lines in upper case", "tr a-z A-Z < {f}", lambda xs: [x.upper() for x in xs]),
    ("each of its lines spelled backwards", "rev {f}", lambda xs: [x[::-1] for x in xs]),
    ("only its first line", "head -n 1 {f}", lambda xs: xs[:1]),
    ("only its last line", "tail -n 1 {f}", lambda xs: xs[-1:]),
    ("only its first three lines", "head -n 3 {f}", lambda xs: xs[:3]),
    ("only its last three lines", "tail -n 3 {f}", lambda xs: xs[-3:]),
    ("the number of its lines", "wc -l < {f}", lambda xs: [str(len(xs))]),
)


def _lines(rng: random.Random, name: str) -> ToyTask:
    what, command, transform = rng.choice(_LINE_TOOLS)
    # A list the command changes (no copy passes), with a repeated word (sort and sort -u differ).
    while True:
        lines = [rng.choice(_WORDS) for _ in range(rng.randint(5, 9))]
        if len(set(lines)) < len(lines) and transform(lines) != lines:
            break
    return ToyTask(
        name=name,
        instruction=(
            "The file `/workspace/input.txt` holds a list of words, one per line. "
            f"Write {what} into the file `/workspace/answer.txt`.\n"
        ),
        answer="\n".join(transform(lines)),
        solve=command.format(f="/workspace/input.txt") + " > /workspace/answer.txt\n",
        files={"input.txt": "\n".join(lines) + "\n"},
        tags=("lines",),
    )


_FAMILIES: dict[str, Callable[[random.Random, str], ToyTask]] = {
    "echo": _echo,
    "arith": _arith,
    "reverse": _reverse,
    "count": _count,
    "lines": _lines,
}
FAMILIES: tuple[str, ...] = tuple(_FAMILIES)


def make_task(family: str, rng: random.Random, name: str) -> ToyTask:
    """Draw one task of ``family`` from ``rng``."""
    try:
        build = _FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown task family {family!r}; choose one of {', '.join(FAMILIES)}") from None
    return build(rng, name)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))
    path.chmod(mode)


def _write_task(task: ToyTask, task_dir: Path) -> None:
    tags = ", ".join(f'"{tag}"' for tag in (*task.tags, "generated"))
    _write(task_dir / "task.toml", _TASK_TOML.format(tags=tags))
    _write(task_dir / "instruction.md", task.instruction)
    dockerfile = "FROM host\nWORKDIR /workspace\n"
    for rel, content in sorted(task.files.items()):
        _write(task_dir / "environment" / rel, content)
        dockerfile += f"COPY {rel} /workspace/{rel}\n"
    _write(task_dir / "environment" / "Dockerfile", dockerfile)
    _write(task_dir / "tests" / "test.sh", _TEST_SH.format(partial_credit=task.partial_credit), 0o755)
    _write(task_dir / "tests" / "expected.txt", task.answer + "\n")
    _write(task_dir / "solution" / "solve.sh", "#!/bin/bash\nset -euo pipefail\n" + task.solve, 0o755)
    for directory in (task_dir, *(p for p in task_dir.rglob("*") if p.is_dir())):
        directory.chmod(0o755)


def generate_tasks(
    out_dir: str | os.PathLike[str], family: str, n: int, seed: int, *, overwrite: bool = False
) -> list[Path]:
    """Write ``n`` tasks of ``family`` under ``out_dir``, deterministically from ``seed``.

    The task directories are named ``<family>-<seed>-<index>`` (index zero-padded to 4 digits)
    and returned in index order. An existing directory of the same name raises
    ``FileExistsError`` unless ``overwrite`` is set, in which case it is replaced.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, not {n}")
    if family not in _FAMILIES:
        raise ValueError(f"unknown task family {family!r}; choose one of {', '.join(FAMILIES)}")
    out = Path(out_dir)
    rng = random.Random(f"sandrl.generated:{family}:{seed}")
    tasks = [make_task(family, rng, f"{family}-{seed}-{i:04d}") for i in range(n)]
    written = []
    for task in tasks:
        task_dir = out / task.name
        if task_dir.exists():
            if not overwrite:
                raise FileExistsError(f"{task_dir} exists; pass overwrite=True to replace it")
            shutil.rmtree(task_dir)
        _write_task(task, task_dir)
        written.append(task_dir)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sandrl.tasks.builtin.generated OUT_DIR FAMILY N SEED``"""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 4 or not args[2].isdigit() or not args[3].lstrip("-").isdigit():
        print(f"usage: python -m sandrl.tasks.builtin.generated OUT_DIR {{{','.join(FAMILIES)}}} N SEED")
        return 2
    for path in generate_tasks(args[0], args[1], int(args[2]), int(args[3])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
