#!/bin/bash
# Verifier: runs the hidden tests in /tests against the repository in /workspace.
# Writes 1 to /logs/verifier/reward.txt when every test passes, 0 otherwise.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
export PYTHONDONTWRITEBYTECODE=1
# The repository may be owned by another uid inside the sandbox: trust it.
export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0="*"
cd /workspace || exit 0
if timeout 50 python3 -m pytest -q -p no:cacheprovider -o addopts="" /tests; then
    echo 1 > /logs/verifier/reward.txt
fi
