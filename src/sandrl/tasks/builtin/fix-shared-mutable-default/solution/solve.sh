#!/bin/bash
# Oracle: None defaults, copy the caller's lists.
set -euo pipefail
cd /workspace
python3 - <<'PY'
from pathlib import Path

p = Path("basket.py")
s = p.read_text()
s = s.replace("def __init__(self, items=[]):\n        self.items = items",
              "def __init__(self, items=None):\n        self.items = list(items) if items is not None else []")
s = s.replace('def tag_order(basket, tags=[]):\n    """Tags describing an order: the given ones plus computed ones."""',
              'def tag_order(basket, tags=None):\n    """Tags describing an order: the given ones plus computed ones."""\n    tags = list(tags) if tags is not None else []')
p.write_text(s)
PY
