import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
ENV = {"ASAN_OPTIONS": "detect_leaks=1:exitcode=99", "PATH": "/usr/bin:/bin"}
WS = " \t\v\f\r"


@pytest.fixture(scope="module")
def harness():
    tmp = Path(tempfile.mkdtemp())
    shutil.copy("/tests/harness.c", tmp)
    shutil.copy("/workspace/strutil.c", tmp)
    (tmp / "strutil.h").write_text(Path("/tests/strutil.h.orig").read_text())
    proc = subprocess.run(
        ["gcc", *FLAGS, "-I", str(tmp), "-o", str(tmp / "harness"), str(tmp / "harness.c"), str(tmp / "strutil.c")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    yield tmp / "harness"
    shutil.rmtree(tmp)


def ref(fields):
    op = fields[0]
    if op == "trim":
        return fields[1].strip(WS)
    if op == "count":
        return str(len([w for w in fields[1].replace("\t", " ").split(" ") if w.strip(WS)]))
    if op == "join":
        return fields[1].join(fields[2:])
    if op == "replace":
        return "(null)" if fields[2] == "" else fields[1].replace(fields[2], fields[3])
    raise AssertionError(op)


def count_words(s):
    n, inword = 0, False
    for ch in s:
        if ch in WS:
            inword = False
        elif not inword:
            inword, n = True, n + 1
    return n


def run(harness, cases):
    text = "".join("\t".join(c) + "\n" for c in cases)
    proc = subprocess.run([str(harness)], input=text, capture_output=True, text=True, timeout=60, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split("\n")[:-1]


def expected(case):
    if case[0] == "count":
        return f"[{count_words(case[1])}]"
    return f"[{ref(case)}]"


def test_examples(harness):
    cases = [
        ("trim", "   hello, world \v\f"),
        ("trim", "   "),
        ("trim", ""),
        ("trim", "x"),
        ("count", "  the quick  brown\vfox "),
        ("count", ""),
        ("count", "   "),
        ("join", ", ", "a", "b", "c"),
        ("join", "-"),
        ("join", "", "x", "", "y"),
        ("join", "::", "solo"),
        ("replace", "one fish two fish", "fish", "cat"),
        ("replace", "aaa", "aa", "b"),
        ("replace", "abc", "", "x"),
        ("replace", "abc", "abc", ""),
        ("replace", "xyz", "q", "long replacement"),
    ]
    assert run(harness, cases) == [expected(c) for c in cases]


def test_random(harness):
    rng = random.Random(123)
    alphabet = "ab .,\v\f xyz"
    word = lambda: "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))  # noqa: E731
    cases = []
    for _ in range(4000):
        kind = rng.choice(["trim", "count", "join", "replace"])
        if kind in ("trim", "count"):
            cases.append((kind, word()))
        elif kind == "join":
            cases.append(("join", rng.choice(["", ",", " - ", "ab"]), *[word() for _ in range(rng.randint(0, 6))]))
        else:
            s = "".join(rng.choice("ab") for _ in range(rng.randint(0, 30)))
            cases.append(
                (
                    "replace",
                    s,
                    "".join(rng.choice("ab") for _ in range(rng.randint(1, 3))),
                    rng.choice(["", "X", "ab", "YYYY", "a"]),
                )
            )
    assert run(harness, cases) == [expected(c) for c in cases]


def test_long_strings(harness):
    big = "ab" * 50000
    cases = [("replace", big, "b", "xyz"), ("join", "--", *["q" * 1000] * 50), ("count", "w " * 30000)]
    assert run(harness, cases) == [expected(c) for c in cases]
