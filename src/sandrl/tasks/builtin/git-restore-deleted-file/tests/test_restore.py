import hashlib
import subprocess
from pathlib import Path

W = Path("/workspace")
# sha256 of the script's last version before its deletion (KEEP = 3, de-duplicating rotate)
EXPECTED_SHA256 = "1898eb6fda65ab7393f45c83151621a729a0ab16493caf178890cfab92d0c34e"


def git(*args):
    proc = subprocess.run(["git", *args], cwd=W, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, (args, proc.stderr)
    return proc.stdout


def test_restored_content():
    committed = subprocess.run(["git", "show", "main:scripts/rotate_keys.py"], cwd=W, capture_output=True,
                               timeout=30).stdout
    assert hashlib.sha256(committed).hexdigest() == EXPECTED_SHA256
    assert hashlib.sha256((W / "scripts" / "rotate_keys.py").read_bytes()).hexdigest() == EXPECTED_SHA256


def test_one_new_commit():
    assert git("rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert git("log", "-1", "--format=%s", "main~1").strip() == "README: link the key runbook"
    assert int(git("rev-list", "--count", "main~1")) == 12
    assert git("diff", "--name-status", "main~1", "main").split() == ["A", "scripts/rotate_keys.py"]
    assert "rotate_keys.py" in git("log", "-1", "--format=%B", "main")
    assert len(git("log", "-1", "--format=%P", "main").split()) == 1


def test_clean():
    assert git("status", "--porcelain", "--untracked-files=no") == ""
    assert not (W / "tools" / "rotate_keys.py").exists()
