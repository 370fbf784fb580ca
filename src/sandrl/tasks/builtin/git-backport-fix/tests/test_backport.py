import subprocess
from pathlib import Path

W = Path("/workspace")


def git(*args):
    proc = subprocess.run(["git", *args], cwd=W, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, (args, proc.stderr)
    return proc.stdout.strip()


def load(rev):
    scope = {}
    exec(compile(git("show", f"{rev}:ranges.py"), "ranges.py", "exec"), scope)
    return scope


def test_main_unchanged():
    assert git("log", "--format=%s", "main").splitlines() == [
        "Add count_pages; start 1.3",
        "Fix parse_range dropping the last page of a range",
        "Add page export",
        "Release 1.2.0",
    ]


def test_release_branch_history():
    assert git("log", "-1", "--format=%s", "release-1.2~1") == "Start 1.2.1"
    assert git("rev-list", "--count", "release-1.2") == "3"
    assert len(git("log", "-1", "--format=%P", "release-1.2").split()) == 1
    assert git("diff", "--name-only", "release-1.2~1", "release-1.2") == "ranges.py"


def test_release_branch_content():
    files = set(git("ls-tree", "-r", "--name-only", "release-1.2").splitlines())
    assert files == {"ranges.py", "VERSION"}
    assert git("show", "release-1.2:VERSION") == "1.2.1-dev"
    scope = load("release-1.2")
    assert "count_pages" not in scope
    assert scope["parse_range"]("1-3,7,10-12") == [1, 2, 3, 7, 10, 11, 12]
    assert scope["parse_range"]("5-5, 2") == [2, 5]
    assert scope["format_range"](scope["parse_range"]("4-9,11")) == "4-9,11"


def test_checked_out_and_clean():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "release-1.2"
    assert git("status", "--porcelain", "--untracked-files=no") == ""
