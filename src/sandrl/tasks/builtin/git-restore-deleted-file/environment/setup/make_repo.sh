#!/bin/bash
# Builds the task's repository in /workspace with a fixed, reproducible history.
set -euo pipefail
cd /workspace
git init -q -b main .
git config user.name "Dana Developer"
git config user.email "dana@example.com"
n=0
commit() {
    n=$((n + 1))
    export GIT_AUTHOR_DATE="$((1707000000 + n * 7200)) +0000" GIT_COMMITTER_DATE="$((1707000000 + n * 7200)) +0000"
    git add -A
    git commit -q -m "$1"
}
mkdir -p scripts tools docs
printf 'print("build")\n' > scripts/build.py
printf '# ops\n' > README.md
commit "Initial layout"

cat > scripts/rotate_keys.py <<'PY'
"""Rotate the API signing keys."""
import json
import sys

KEEP = 2


def rotate(keys, new_key):
    keys = [new_key] + keys
    return keys[:KEEP]


if __name__ == "__main__":
    keys = json.load(open(sys.argv[1]))
    print(json.dumps(rotate(keys, sys.argv[2])))
PY
commit "Add key rotation script"

printf 'print("deploy")\n' > scripts/deploy.py
commit "Add deploy script"

sed -i 's/^KEEP = 2$/KEEP = 3/' scripts/rotate_keys.py
commit "Keep three signing keys"

cat > tools/rotate_keys.py <<'PY'
"""Old prototype of key rotation (unused)."""
PY
commit "Add rotation prototype"

sed -i 's/    keys = \[new_key\] + keys/    keys = [new_key] + [k for k in keys if k != new_key]/' scripts/rotate_keys.py
commit "Do not keep a duplicate of the new key"

printf '\nSee docs/ for runbooks.\n' >> README.md
commit "README: runbooks"

git rm -q tools/rotate_keys.py
commit "Remove the rotation prototype"

printf '# Key rotation runbook\n\nRun scripts/rotate_keys.py monthly.\n' > docs/keys.md
commit "Key rotation runbook"

git rm -q scripts/rotate_keys.py
commit "Clean up scripts"

printf 'print("deploy v2")\n' > scripts/deploy.py
commit "Deploy v2"

printf '\nSee docs/keys.md.\n' >> README.md
commit "README: link the key runbook"
