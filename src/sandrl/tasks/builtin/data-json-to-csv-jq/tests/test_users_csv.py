import csv
import hashlib
import json
from pathlib import Path

SRC = Path("/workspace/users.json")
OUT = Path("/workspace/active_users.csv")
SHA256 = "62c3d488ef25c8ed827aec4a339a35f7643297f3eda7a8d67fd1ac38a10cd004"


def expected():
    users = json.loads(SRC.read_text())["users"]
    rows = []
    for u in sorted(users, key=lambda u: u["id"]):
        if u.get("active") is not True:
            continue
        city = (u.get("address") or {}).get("city") or ""
        rows.append(
            [
                str(u["id"]),
                f"{u['name']['first']} {u['name']['last']}",
                u.get("email") or "",
                city,
                ";".join(u.get("tags") or []),
            ]
        )
    return rows


def test_source_untouched():
    assert hashlib.sha256(SRC.read_bytes()).hexdigest() == SHA256


def test_csv():
    raw = OUT.read_bytes()
    assert not raw.startswith(b"\xef\xbb\xbf")
    with OUT.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f, strict=True))
    assert rows[0] == ["id", "full_name", "email", "city", "tags"]
    want = expected()
    assert len(want) > 50
    assert rows[1:] == want
