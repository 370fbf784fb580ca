#!/bin/bash
# Oracle: ceiling division for the page count, 1-based start offset, and the window's last
# allowed start is pages - width + 1.
set -euo pipefail
cd /workspace
python3 - <<'PY'
from pathlib import Path

p = Path("pager.py")
src = p.read_text()
src = src.replace("return total // per_page", "return -(-total // per_page)")
src = src.replace("start = page * per_page", "start = (page - 1) * per_page")
src = src.replace("min(first, pages - width))", "min(first, pages - width + 1))")
p.write_text(src)
PY
