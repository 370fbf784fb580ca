#!/bin/bash
# Oracle: the century rule, and days_between is b - a, not a - b.
set -euo pipefail
cd /workspace
python3 - <<'PY'
from pathlib import Path

p = Path("caldate.py")
s = p.read_text()
s = s.replace("return year % 4 == 0", "return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)")
s = s.replace("return _ordinal(a) - _ordinal(b)", "return _ordinal(b) - _ordinal(a)")
p.write_text(s)
PY
