#!/bin/bash
# Oracle: hash every file, group by hash, keep groups of two or more.
set -euo pipefail
cd /workspace/files
export LC_ALL=C
find . -type f -printf '%P\0' | xargs -0 sha256sum \
    | sort -k1,1 -k2 \
    | awk '{ h = $1; p = substr($0, 67); if (h == last) { line = line " " p; n++ } else { if (n > 1) print line; line = p; n = 1 } last = h }
           END { if (n > 1) print line }' \
    | sort > /workspace/duplicates.txt
