#!/bin/bash
# Oracle: include stdlib.h, a qsort-compatible comparator, the missing semicolon, %zu, and the
# parenthesised median.
set -euo pipefail
cd /workspace
python3 - <<'PY'
from pathlib import Path

p = Path("stats.c")
s = p.read_text()
s = s.replace("#include <stdio.h>\n", "#include <stdio.h>\n#include <stdlib.h>\n")
s = s.replace("static int cmp(double *a, double *b)\n{\n    return (*a > *b) - (*a < *b);",
              "static int cmp(const void *pa, const void *pb)\n{\n"
              "    const double *a = pa, *b = pb;\n    return (*a > *b) - (*a < *b);")
s = s.replace("values[n++] = v\n", "values[n++] = v;\n")
s = s.replace('printf("count=%d\\n", n);', 'printf("count=%zu\\n", n);')
s = s.replace("median = values[n / 2 - 1] + values[n / 2] / 2;", "median = (values[n / 2 - 1] + values[n / 2]) / 2;")
p.write_text(s)
PY
