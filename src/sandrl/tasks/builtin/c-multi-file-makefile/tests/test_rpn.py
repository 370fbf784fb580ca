import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tree():
    tmp = Path(tempfile.mkdtemp()) / "proj"
    shutil.copytree("/workspace", tmp, ignore=shutil.ignore_patterns("build", "bin", ".git"))
    yield tmp
    shutil.rmtree(tmp.parent)


@pytest.fixture(scope="module")
def rpn(tree):
    subprocess.run(["make", "-C", str(tree), "clean"], capture_output=True, timeout=60)
    proc = subprocess.run(["make", "-C", str(tree), "-j4"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tree / "bin" / "rpn").is_file()
    for src in (tree / "src").glob("*.c"):
        assert (tree / "build" / (src.stem + ".o")).is_file(), src.stem
    return tree / "bin" / "rpn"


def c_div(a, b):
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def ref(line):
    stack = []
    for tok in line.split():
        body = tok[1:] if tok.startswith("-") and len(tok) > 1 else tok
        if body.isdigit() and body.isascii():
            stack.append(int(tok))
        elif tok in ("+", "-", "*", "/", "%"):
            if len(stack) < 2:
                return None
            b, a = stack.pop(), stack.pop()
            if tok in "/%" and b == 0:
                return None
            stack.append(
                {
                    "+": a + b,
                    "-": a - b,
                    "*": a * b,
                    "/": c_div(a, b) if b else 0,
                    "%": a - b * c_div(a, b) if b else 0,
                }[tok]
            )
        elif tok == "dup":
            if not stack:
                return None
            stack.append(stack[-1])
        elif tok == "swap":
            if len(stack) < 2:
                return None
            stack[-1], stack[-2] = stack[-2], stack[-1]
        else:
            return None
        if stack and abs(stack[-1]) > 2**62:
            raise OverflowError(line)
    return stack[0] if len(stack) == 1 else None


def fits(line):
    try:
        ref(line)
    except OverflowError:
        return False
    return True


def run(rpn, lines):
    proc = subprocess.run([str(rpn)], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0
    return proc.stdout.splitlines()


def check(rpn, lines):
    outputs = run(rpn, lines)
    wanted = [ref(line) for line in lines if line.strip()]
    assert len(outputs) == len(wanted), outputs
    for line, out, want in zip([x for x in lines if x.strip()], outputs, wanted):
        if want is None:
            assert out.startswith("error:"), (line, out)
        else:
            assert out == str(want), (line, out, want)


def test_examples(rpn):
    assert run(rpn, ["3 4 + 2 *", "5 dup *", "1 0 /"])[:2] == ["14", "25"]
    check(
        rpn,
        [
            "3 4 + 2 *",
            "5 dup *",
            "1 0 /",
            "",
            "   ",
            "-7 2 /",
            "-7 2 %",
            "7 -2 %",
            "1 2",
            "+",
            "dup",
            "2 3 swap -",
            "4 x +",
            "9 1 0 % +",
            "-",
            "--5",
            "12a 3 +",
        ],
    )


def test_random_expressions(rpn):
    rng = random.Random(2024)
    lines = []
    for _ in range(3000):
        toks = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.45:
                toks.append(str(rng.randint(-50, 50)))
            elif r < 0.85:
                toks.append(rng.choice("+-*/%"))
            elif r < 0.93:
                toks.append(rng.choice(["dup", "swap"]))
            else:
                toks.append(rng.choice(["", "  ", "\t"]))
        line = " ".join(toks)
        if fits(line):
            lines.append(line)
    check(rpn, lines)


def test_clean(rpn, tree):
    proc = subprocess.run(["make", "-C", str(tree), "clean"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert not (tree / "bin").exists() and not (tree / "build").exists()
