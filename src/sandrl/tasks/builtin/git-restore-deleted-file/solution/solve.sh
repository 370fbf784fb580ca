#!/bin/bash
# Oracle: the last commit touching the path deleted it; restore from its parent.
set -euo pipefail
cd /workspace
gone=$(git rev-list -n 1 main -- scripts/rotate_keys.py)
git checkout "$gone^" -- scripts/rotate_keys.py
git commit -q -m "Restore scripts/rotate_keys.py"
