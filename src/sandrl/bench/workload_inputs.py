"""Generate the benchmark workloads' inputs, deterministically, under one directory.

Run inside a sandbox as ``python3 workload_inputs.py ROOT`` (standard library only, no
network): :mod:`sandrl.bench.workloads` writes this file into the sandbox and runs it. It
makes, from a fixed seed, so every sandbox and every host gets byte-identical inputs:

- ``proj/``: a small Python package (an expression tokenizer, parser and evaluator, string
  utilities) with a pytest suite of a few hundred parametrized tests;
- ``cpu.py``: a CPU-bound pure-Python script (a sieve, a dynamic program, sorting);
- ``c/``: C translation units with a header and a Makefile, plus ``big.c``, one larger unit;
- ``cxx/app.cpp``: a C++ unit using the standard containers and algorithms;
- ``text/``: log-like text files for grep/sort/awk/sed pipelines;
- ``repo/``: a git repository with history (fixed author and dates) and uncommitted changes.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

SEED = 20240601
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "theta",
    "kappa",
    "lambda",
    "sigma",
    "omega",
    "parse",
    "build",
    "cache",
    "token",
    "socket",
    "buffer",
    "worker",
    "queue",
    "shard",
    "index",
    "vector",
    "matrix",
    "kernel",
    "thread",
    "signal",
    "commit",
    "branch",
]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def python_project(root: Path, rng: random.Random) -> None:
    pkg = root / "proj" / "calc"
    _write(pkg / "__init__.py", '"""A tiny expression calculator."""\n')
    _write(
        pkg / "tokens.py",
        """import re

TOKEN = re.compile(r"\\s*(?:(\\d+\\.?\\d*)|(.))")


def tokenize(text):
    out = []
    for number, op in TOKEN.findall(text):
        if number:
            out.append(("num", float(number)))
        elif op.strip():
            out.append(("op", op))
    return out
""",
    )
    _write(
        pkg / "parser.py",
        """from calc.tokens import tokenize

PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "%": 2}


def to_rpn(text):
    out, stack = [], []
    for kind, value in tokenize(text):
        if kind == "num":
            out.append(value)
        elif value == "(":
            stack.append(value)
        elif value == ")":
            while stack[-1] != "(":
                out.append(stack.pop())
            stack.pop()
        else:
            while stack and stack[-1] != "(" and PREC[stack[-1]] >= PREC[value]:
                out.append(stack.pop())
            stack.append(value)
    while stack:
        out.append(stack.pop())
    return out


def evaluate(text):
    stack = []
    for item in to_rpn(text):
        if isinstance(item, float):
            stack.append(item)
            continue
        b, a = stack.pop(), stack.pop()
        if item == "+":
            stack.append(a + b)
        elif item == "-":
            stack.append(a - b)
        elif item == "*":
            stack.append(a * b)
        elif item == "/":
            stack.append(a / b)
        else:
            stack.append(a % b)
    return stack[0]
""",
    )
    _write(
        pkg / "text.py",
        """def slug(s):
    return "-".join("".join(c for c in w.lower() if c.isalnum()) for w in s.split())


def wrap(s, width):
    lines, line = [], ""
    for word in s.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        lines.append(line)
    return lines
""",
    )
    cases = []
    for _ in range(300):
        a, b, c = rng.randint(1, 99), rng.randint(1, 99), rng.randint(1, 9)
        op1, op2 = rng.choice("+-*"), rng.choice("+-*")
        expr = f"({a} {op1} {b}) {op2} {c}"
        cases.append(f"    ({expr!r}, {eval(expr)!r}),")
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 30))) for _ in range(100)]
    _write(
        root / "proj" / "tests" / "test_calc.py",
        "import pytest\n\nfrom calc.parser import evaluate\n\nCASES = [\n"
        + "\n".join(cases)
        + "\n]\n\n\n@pytest.mark.parametrize(('expr', 'want'), CASES)\ndef test_evaluate(expr, want):\n"
        "    assert evaluate(expr) == pytest.approx(want)\n",
    )
    _write(
        root / "proj" / "tests" / "test_text.py",
        "import pytest\n\nfrom calc.text import slug, wrap\n\nSENTENCES = "
        + repr(sentences)
        + "\n\n\n@pytest.mark.parametrize('s', SENTENCES)\ndef test_wrap(s):\n"
        "    lines = wrap(s, 40)\n    assert ' '.join(lines) == ' '.join(s.split())\n"
        "    assert all(len(x) <= 40 or ' ' not in x for x in lines)\n\n\n"
        "@pytest.mark.parametrize('s', SENTENCES)\ndef test_slug(s):\n    assert ' ' not in slug(s)\n",
    )
    _write(root / "proj" / "conftest.py", "")


CPU_SCRIPT = '''"""CPU-bound: a sieve, an edit-distance dynamic program and a sort, in pure Python."""
import random

def sieve(n):
    flags = bytearray([1]) * (n + 1)
    flags[0:2] = b"\\0\\0"
    for i in range(2, int(n ** 0.5) + 1):
        if flags[i]:
            flags[i * i :: i] = bytearray(len(flags[i * i :: i]))
    return sum(flags)

def edit_distance(a, b):
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]

rng = random.Random(7)
a = "".join(rng.choice("acgt") for _ in range(800))
b = "".join(rng.choice("acgt") for _ in range(800))
data = [rng.random() for _ in range(150000)]
print(sieve(1500000), edit_distance(a, b), sorted(data)[len(data) // 2] > 0)
'''


def c_sources(root: Path, rng: random.Random, units: int = 4, funcs: int = 16) -> None:
    cdir = root / "c"
    _write(
        cdir / "common.h",
        "#include <stdint.h>\n#include <stddef.h>\n"
        + "".join(f"uint64_t unit{u}_run(uint64_t seed);\n" for u in range(units)),
    )
    for u in range(units):
        body = ["#include <stdio.h>", "#include <stdlib.h>", "#include <string.h>", '#include "common.h"', ""]
        for f in range(funcs):
            k1, k2, k3 = rng.randint(3, 31), rng.randint(1, 1 << 20), rng.randint(2, 9)
            body.append(
                f"static uint64_t u{u}f{f}(uint64_t x) {{\n"
                f"    uint64_t acc[16] = {{0}};\n"
                f"    for (int i = 0; i < {k3 * 8}; i++) {{\n"
                f"        x ^= x << {k1 % 13 + 1}; x ^= x >> {k1 % 7 + 1}; x *= {k2}u;\n"
                f"        acc[i & 15] += (x % {k3 + 1}) ? x >> 3 : x << 2;\n"
                f"        if (acc[i & 15] > {k2 * 7}u) acc[(i + {k3}) & 15] ^= acc[i & 15];\n"
                f"    }}\n"
                f"    for (int i = 1; i < 16; i++) for (int j = i; j > 0 && acc[j - 1] > acc[j]; j--) {{\n"
                f"        uint64_t t = acc[j]; acc[j] = acc[j - 1]; acc[j - 1] = t;\n"
                f"    }}\n"
                f"    return acc[{f % 16}] + acc[15 - {f % 16}];\n"
                f"}}\n"
            )
        calls = " + ".join(f"u{u}f{f}(seed + {f})" for f in range(funcs))
        body.append(f"uint64_t unit{u}_run(uint64_t seed) {{\n    return {calls};\n}}\n")
        _write(cdir / f"unit{u}.c", "\n".join(body))
    main_calls = " ^ ".join(f"unit{u}_run({u})" for u in range(units))
    _write(
        cdir / "main.c",
        f'#include <stdio.h>\n#include "common.h"\nint main(void) {{\n'
        f'    printf("%llu\\n", (unsigned long long)({main_calls}));\n    return 0;\n}}\n',
    )
    objs = " ".join(f"unit{u}.o" for u in range(units)) + " main.o"
    _write(
        cdir / "Makefile",
        f"CFLAGS = -O2 -Wall\nOBJS = {objs}\n\napp: $(OBJS)\n\t$(CC) $(CFLAGS) -o $@ $(OBJS)\n\n"
        "%.o: %.c common.h\n\t$(CC) $(CFLAGS) -c -o $@ $<\n\nclean:\n\trm -f app $(OBJS)\n",
    )
    big = ['#include "common.h"', "#include <string.h>", ""]
    for f in range(funcs * 4):
        big.append(
            f"uint64_t big{f}(const uint8_t *p, size_t n) {{\n"
            f"    uint64_t h = {rng.randint(1, 1 << 30)}u;\n"
            f"    for (size_t i = 0; i < n; i++) {{ h = (h ^ p[i]) * 1099511628211u; h ^= h >> {f % 29 + 3}; }}\n"
            f"    uint8_t tmp[64]; memset(tmp, (int)(h & 0xff), sizeof tmp);\n"
            f"    for (int r = 0; r < 4; r++) for (int i = 0; i < 64; i++)\n"
            f"        tmp[i] = (uint8_t)(tmp[(i * {f % 7 + 3}) & 63] + i + r);\n"
            f"    return h + tmp[{f % 64}];\n}}\n"
        )
    _write(cdir / "big.c", "\n".join(big))


def cxx_source(root: Path, rng: random.Random, funcs: int = 4) -> None:
    lines = [
        "#include <algorithm>",
        "#include <map>",
        "#include <numeric>",
        "#include <string>",
        "#include <unordered_map>",
        "#include <vector>",
        "",
        "template <typename T> T fold(const std::vector<T>& v) { return std::accumulate(v.begin(), v.end(), T{}); }",
        "",
    ]
    for f in range(funcs):
        lines.append(
            f"std::map<std::string, long> stage{f}(const std::vector<std::string>& words) {{\n"
            f"    std::unordered_map<std::string, long> counts;\n"
            f"    for (const auto& w : words) counts[w + std::to_string(w.size() % {rng.randint(2, 9)})]++;\n"
            f"    std::vector<std::pair<std::string, long>> items(counts.begin(), counts.end());\n"
            f"    std::sort(items.begin(), items.end(), [](auto& a, auto& b) {{ return a.second > b.second; }});\n"
            f"    std::vector<long> values; for (auto& kv : items) values.push_back(kv.second * {f + 1});\n"
            f"    std::map<std::string, long> out(items.begin(), items.end());\n"
            f'    out["total"] = fold(values);\n'
            f"    return out;\n}}\n"
        )
    lines.append("long run_all(const std::vector<std::string>& w) {\n    long s = 0;")
    lines += [f"    s += stage{f}(w).size();" for f in range(funcs)]
    lines.append("    return s;\n}\n")
    _write(root / "cxx" / "app.cpp", "\n".join(lines))


def text_files(root: Path, rng: random.Random, files: int = 4, lines: int = 25000) -> None:
    levels = ["INFO"] * 6 + ["DEBUG"] * 3 + ["WARN", "ERROR"]
    for i in range(files):
        out = []
        for n in range(lines):
            out.append(
                f"2024-06-{1 + n % 28:02d}T{n % 24:02d}:{n % 60:02d}:{(n * 7) % 60:02d} {rng.choice(levels)} "
                f"{rng.choice(WORDS)}.{rng.choice(WORDS)} user={rng.choice(WORDS)} "
                f"latency_ms={rng.randint(1, 5000)}"
            )
        _write(root / "text" / f"service{i}.log", "\n".join(out) + "\n")


def git_repo(root: Path, rng: random.Random, files: int = 40, commits: int = 30) -> None:
    repo = root / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "bench@sandrl.invalid",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "bench@sandrl.invalid",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(repo),
    }

    def git(*args: str, date: int = 0) -> None:
        stamp = f"{1700000000 + date * 3600} +0000"
        subprocess.run(
            ["git", *args],
            cwd=repo,
            env={**env, "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp},
            check=True,
            stdout=subprocess.DEVNULL,
        )

    git("init", "-q", "-b", "main")
    contents = {f"src/mod{i}.py": [f"# module {i}"] + [f"x{j} = {j}" for j in range(200)] for i in range(files)}
    for c in range(commits):
        for name in rng.sample(sorted(contents), 6) if c else sorted(contents):
            body = contents[name]
            for _ in range(10):
                body[rng.randrange(1, len(body))] = f"v{rng.randrange(10**6)} = {rng.choice(WORDS)!r}"
            _write(repo / name, "\n".join(body) + "\n")
        git("add", "-A")
        git("commit", "-q", "-m", f"change {c}: {rng.choice(WORDS)} {rng.choice(WORDS)}", date=c)
    for name in rng.sample(sorted(contents), 5):
        body = contents[name]
        body[rng.randrange(1, len(body))] = "uncommitted = True"
        _write(repo / name, "\n".join(body) + "\n")
    _write(repo / "notes.txt", "untracked\n")


def generate(root: Path) -> None:
    rng = random.Random(SEED)
    python_project(root, rng)
    _write(root / "cpu.py", CPU_SCRIPT)
    c_sources(root, rng)
    cxx_source(root, rng)
    text_files(root, rng)
    git_repo(root, rng)
    _write(root / "READY", "ok\n")


if __name__ == "__main__":
    generate(Path(sys.argv[1] if len(sys.argv) > 1 else "/workspace/bench"))
