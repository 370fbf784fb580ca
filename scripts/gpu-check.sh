#!/usr/bin/env bash
# The trainer on one GPU (issue #39): `python -m sandrl.bench.gpu_check` with the machine's own PyTorch,
# a Qwen3-0.6B-shaped model in bf16 with FSDP2, activation checkpointing and packing. Two uses:
#
#   scripts/gpu-check.sh wheels [3.11 3.12 ...]   (default: 3.11 and 3.12)
#       Here, where a package index is reachable: the wheels of everything the check needs besides
#       torch and numpy (`python -m sandrl.bench.gpu_check --requirements`, pinned as installed here),
#       for those CPython versions on x86-64 Linux, into .wheels/ (git-ignored; 39 MiB for one version,
#       10 more for each other: keep under the 64 MiB a device run carries).
#
#   [PYTHON=python3] [OUT=dir] scripts/gpu-check.sh [--timed-steps N] [--peak-tflops T] [--tiny]
#       On the GPU machine, from a copy of the repository (no network needed, nothing installed
#       into its Python): sandrl runs from src/; what the machine's Python lacks is installed from
#       .wheels/ into .gpu-check-deps/; the check runs for at most 8 minutes. Prints one JSON line
#       (also $OUT/gpu-check.json when OUT is set); on a failure, {"check": "gpu", "error": ...}
#       and exit status 1.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHEELS=$ROOT/.wheels
DEPS=$ROOT/.gpu-check-deps
LIMIT_S=${GPU_CHECK_LIMIT_S:-480}

if [ "${1:-}" = wheels ]; then
    shift
    versions=("$@")
    [ ${#versions[@]} -gt 0 ] || versions=(3.11 3.12)
    py=${PYTHON:-$ROOT/.venv/bin/python}
    mkdir -p "$WHEELS"
    PYTHONPATH=$ROOT/src "$py" -m sandrl.bench.gpu_check --requirements > "$WHEELS/requirements.txt"
    for version in "${versions[@]}"; do
        "$py" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WHEELS" \
            --implementation cp --python-version "$version" --platform manylinux2014_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
            -r "$WHEELS/requirements.txt"
    done
    echo "$(find "$WHEELS" -name '*.whl' | wc -l) wheels ($(du -sh "$WHEELS" | cut -f1)) in $WHEELS for CPython ${versions[*]}" >&2
    exit 0
fi

PY=${PYTHON:-python3}

fail() {
    # One JSON line saying why, where the check's own would have been.
    local line
    line=$("$PY" -c 'import json, sys; print(json.dumps({"check": "gpu", "error": sys.argv[1]}))' "$1" 2>/dev/null) ||
        line="{\"check\": \"gpu\", \"error\": \"$1\"}"
    echo "$line"
    if [ -n "${OUT:-}" ]; then
        mkdir -p "$OUT" && echo "$line" > "$OUT/gpu-check.json"
    fi
    exit 1
}

command -v "$PY" > /dev/null || fail "no $PY on this machine: set PYTHON to the Python that has PyTorch"
"$PY" -c 'import sys; assert sys.version_info >= (3, 11)' 2> /dev/null ||
    fail "$PY is older than 3.11, which sandrl needs: set PYTHON to another"
"$PY" -c 'import torch' 2> /dev/null || fail "$PY has no torch: the check uses the machine's own PyTorch"

LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
export PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
PROBE='import sandrl.bench.gpu_check, sandrl.train.ranks, sandrl.train.trainer, sandrl.train.plan, transformers, peft'
if ! "$PY" -c "$PROBE" 2> "$LOG"; then
    missing=$(tail -n 1 "$LOG")
    [ -f "$WHEELS/requirements.txt" ] ||
        fail "$PY cannot run the check ($missing) and there is no .wheels/: run 'scripts/gpu-check.sh wheels' where an index is reachable, and bring .wheels/ along"
    "$PY" -m pip install --quiet --no-index --no-deps --find-links "$WHEELS" --target "$DEPS" --upgrade \
        -r "$WHEELS/requirements.txt" > "$LOG" 2>&1 ||
        fail "installing .wheels/ for $PY failed: $(tail -n 1 "$LOG")"
    export PYTHONPATH=$DEPS:$PYTHONPATH
    "$PY" -c "$PROBE" 2> "$LOG" ||
        fail "$PY still cannot run the check after installing .wheels/: $(tail -n 1 "$LOG")"
fi

args=()
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    args=(--out "$OUT/gpu-check.json")
fi
status=0
timeout "$LIMIT_S" "$PY" -m sandrl.bench.gpu_check "${args[@]}" "$@" || status=$?
case $status in
    0) ;;
    124) fail "the check ran past ${LIMIT_S} s and was stopped" ;;
    *) fail "the check failed (exit status $status); its traceback is on stderr above" ;;
esac
