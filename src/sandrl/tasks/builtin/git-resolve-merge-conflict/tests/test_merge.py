import random
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

W = Path("/workspace")


def git(*args):
    proc = subprocess.run(["git", *args], cwd=W, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, (args, proc.stderr)
    return proc.stdout.strip()


def subject(rev):
    return git("log", "-1", "--format=%s", rev)


def test_merge_commit():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    parents = git("log", "-1", "--format=%P", "main").split()
    assert len(parents) == 2
    assert subject(parents[0]) == "cli: usage message"
    assert parents[1] == git("rev-parse", "feature/top-words")
    assert subject("feature/top-words") == "cli: --top N"
    assert not (W / ".git" / "MERGE_HEAD").exists()
    assert git("status", "--porcelain", "--untracked-files=no") == ""


def test_no_conflict_markers_or_old_name():
    for name in ("textstats.py", "cli.py"):
        text = git("show", f"main:{name}")
        for marker in ("<<<<<<<", ">>>>>>>", "=======", "|||||||"):
            assert marker not in text, name
        assert "count_words" not in text


def run_cli(*args):
    return subprocess.run([sys.executable, "cli.py", *args], cwd=W, capture_output=True, text=True, timeout=30)


def test_module():
    sys.path.insert(0, str(W))
    import textstats

    assert not hasattr(textstats, "count_words")
    assert textstats.words.__doc__ and textstats.word_count.__doc__
    text = "It's 2024: the cat and the other cat met 2024 times. The end!"
    assert textstats.word_count(text) == Counter(textstats.words(text))
    assert "2024" in textstats.words(text)
    assert [tuple(x) for x in textstats.top_words(text, 3)] == [("the", 3), ("2024", 2), ("cat", 2)]


def test_cli():
    rng = random.Random(1)
    vocab = ["alpha", "beta", "gamma", "x1", "don't", "Beta", "ALPHA"]
    text = " ".join(rng.choice(vocab) for _ in range(300))
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    counts = Counter(w.lower() for w in text.split())
    full = run_cli(f.name)
    assert full.returncode == 0
    assert full.stdout == "".join(f"{w} {counts[w]}\n" for w in sorted(counts))
    top = run_cli("--top", "2", f.name)
    assert top.returncode == 0
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:2]
    assert top.stdout == "".join(f"{w} {n}\n" for w, n in ranked)
    for bad in ([], [f.name, f.name], ["--top"], ["--top", "2"]):
        proc = run_cli(*bad)
        assert proc.returncode == 2, bad
        assert proc.stderr.strip(), bad
