#!/bin/bash
# Oracle: getc returns an int (a 0xFF byte is not EOF), and remember failures for the status.
set -euo pipefail
cd /workspace
python3 - <<'PY'
from pathlib import Path

p = Path("crc32sum.c")
s = p.read_text()
s = s.replace("    char c;\n", "    int c;\n")
s = s.replace("    make_table();\n", "    int status = 0;\n    make_table();\n")
s = s.replace("strerror(errno));\n            continue;", "strerror(errno));\n            status = 1;\n            continue;")
s = s.replace("    return 0;\n}\n", "    return status;\n}\n")
p.write_text(s)
PY
