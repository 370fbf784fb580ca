#!/bin/bash
# Oracle: the status is the first field after the quoted request.
set -euo pipefail
cd /workspace
export LC_ALL=C
awk -F'"' '{ split($3, a, " "); if (a[1] >= 400 && a[1] <= 599) { split($1, b, " "); print b[1] } }' access.log \
    | sort | uniq -c | awk '{ print $1, $2 }' | sort -k1,1nr -k2,2 | head -n 10 > top_error_ips.txt
