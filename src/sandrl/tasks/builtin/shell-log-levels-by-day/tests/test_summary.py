import csv
import hashlib
import re
from collections import defaultdict
from pathlib import Path

LOGS = Path("/workspace/logs")
ENTRY = re.compile(r"^(\d{4}-\d{2}-\d{2})T\d{2}:\d{2}:\d{2}Z (DEBUG|INFO|WARN|ERROR) +\[")
MANIFEST = {
    "api.log": "de19d7ddca7c74fa1a3c282b4ce46179d9e9642be79b0e13db0ac25bbd6ad35d",
    "db.log": "bb09dd9d91e3df63d3d5c5e0bb272cae066fb621ccf4ec97d8eb23eb85653aa7",
    "old/api.log.1": "fa01684cad3e73a53577b1535c874f1299a96aaf70021b3b46dad959a50b1891",
    "worker.log": "a61e632e5f282f0bfe8d23884ce2f2278d9e879945ebdf83a5f77a63292de923",
}


def expected():
    days = defaultdict(lambda: [0, 0])
    for path in sorted(LOGS.rglob("*")):
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            m = ENTRY.match(line)
            if not m:
                continue
            counts = days[m.group(1)]
            if m.group(2) == "WARN":
                counts[0] += 1
            elif m.group(2) == "ERROR":
                counts[1] += 1
    return [["date", "warn", "error"]] + [[d, str(w), str(e)] for d, (w, e) in sorted(days.items())]


def test_logs_untouched():
    found = {
        str(p.relative_to(LOGS)): hashlib.sha256(p.read_bytes()).hexdigest() for p in LOGS.rglob("*") if p.is_file()
    }
    assert found == MANIFEST


def test_summary():
    out = Path("/workspace/summary.csv")
    assert out.is_file(), "summary.csv is missing"
    with out.open(newline="") as f:
        rows = [[cell.strip() for cell in row] for row in csv.reader(f) if row]
    assert rows == expected()
