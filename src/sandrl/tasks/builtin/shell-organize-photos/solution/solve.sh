#!/bin/bash
# Oracle: bash regex on each name in byte order; bump a suffix while the target exists.
set -euo pipefail
export LC_ALL=C
cd /workspace/inbox
shopt -s nullglob
for name in *; do
    [[ -f $name ]] || continue
    if [[ $name =~ ^IMG_([0-9]{4})([0-9]{2})([0-9]{2})_([0-9]{6})\.([jJ][pP][eE]?[gG])$ ]]; then
        y=${BASH_REMATCH[1]} m=${BASH_REMATCH[2]} d=${BASH_REMATCH[3]} t=${BASH_REMATCH[4]}
        dir=/workspace/photos/$y/$m
        mkdir -p "$dir"
        target=$dir/$y$m$d-$t.jpg
        k=0
        while [[ -e $target ]]; do
            k=$((k + 1))
            target=$dir/$y$m$d-$t-$k.jpg
        done
        mv -- "$name" "$target"
    fi
done
