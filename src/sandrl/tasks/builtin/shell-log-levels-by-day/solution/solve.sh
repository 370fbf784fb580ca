#!/bin/bash
# Oracle: match only real entries, key on the date, count WARN and ERROR in the level field.
set -euo pipefail
cd /workspace
export LC_ALL=C
{
    echo "date,warn,error"
    find logs -type f -print0 | xargs -0 cat \
        | grep -E '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z (DEBUG|INFO|WARN|ERROR) +\[' \
        | awk '{ d = substr($1, 1, 10); seen[d] = 1; if ($2 == "WARN") w[d]++; if ($2 == "ERROR") e[d]++ }
               END { for (d in seen) printf "%s,%d,%d\n", d, w[d], e[d] }' \
        | sort
} > summary.csv
