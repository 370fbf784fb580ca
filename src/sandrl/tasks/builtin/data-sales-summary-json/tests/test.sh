#!/bin/bash
# Verifier: runs the hidden tests in /tests against /workspace.
# Writes 1 to /logs/verifier/reward.txt when every test passes, 0 otherwise.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
export PYTHONDONTWRITEBYTECODE=1
cd /workspace || exit 0
if timeout 50 python3 -m pytest -q -p no:cacheprovider -o addopts="" /tests; then
    echo 1 > /logs/verifier/reward.txt
fi
