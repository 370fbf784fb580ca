import subprocess
from pathlib import Path

W = Path("/workspace")
BAD_SUBJECT = "Simplify discount arithmetic"
ORIGINAL_TIP_SUBJECT = "Update changelog for 2.4"
ORIGINAL_COMMITS = 22


def git(*args):
    proc = subprocess.run(["git", *args], cwd=W, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, (args, proc.stderr)
    return proc.stdout.strip()


def check_at(rev):
    src = git("show", f"{rev}:pricing.py")
    scope = {}
    exec(compile(src, "pricing.py", "exec"), scope)
    try:
        return (scope["apply_discount"](2.5, 25) == 1.88 and scope["apply_discount"](100, 0) == 100
                and scope["add_tax"](10, 20) == 12)
    except Exception:
        return False


def test_answer_file():
    answer = (W / "first_bad_commit.txt").read_text().strip()
    assert len(answer) == 40 and all(c in "0123456789abcdef" for c in answer)
    assert git("cat-file", "-t", answer) == "commit"
    assert git("log", "-1", "--format=%s", answer) == BAD_SUBJECT
    assert not check_at(answer)
    assert check_at(answer + "^")
    assert git("merge-base", "--is-ancestor", answer, "main") == ""


def test_history_kept_and_one_new_commit():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git("log", "-1", "--format=%s", "main~1") == ORIGINAL_TIP_SUBJECT
    assert int(git("rev-list", "--count", "main~1")) == ORIGINAL_COMMITS
    assert git("rev-list", "--count", "--merges", "main") == "0"


def test_fixed_and_later_changes_kept():
    assert check_at("main")
    assert git("diff", "--name-only", "main~1", "main") == "pricing.py"
    src = git("show", "main:pricing.py")
    assert "quantity must be positive" in src
    assert "def add_tax(price, rate=23):" in src


def test_clean_tree_and_selfcheck():
    assert git("status", "--porcelain", "--untracked-files=no") == ""
    proc = subprocess.run(["bash", str(W / "check.sh")], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
