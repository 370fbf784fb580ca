import hashlib
import re
from collections import Counter
from pathlib import Path

LOG = Path("/workspace/access.log")
OUT = Path("/workspace/top_error_ips.txt")
LOG_SHA256 = "f3b260206ac3104b0cbe8307cedbe1f39139a3f772e3bb5b669166d3e62b860c"
LINE = re.compile(r'^(\S+) \S+ \S+ \[[^\]]*\] "[^"]*" (\d{3}) ')


def expected():
    counts = Counter()
    for line in LOG.read_text().splitlines():
        m = LINE.match(line)
        assert m, line
        if 400 <= int(m.group(2)) <= 599:
            counts[m.group(1)] += 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    return [f"{n} {ip}" for ip, n in ranked]


def test_log_untouched():
    assert hashlib.sha256(LOG.read_bytes()).hexdigest() == LOG_SHA256


def test_top_ips():
    assert OUT.is_file(), "top_error_ips.txt is missing"
    lines = [line.rstrip() for line in OUT.read_text().splitlines() if line.strip()]
    assert lines == expected()
