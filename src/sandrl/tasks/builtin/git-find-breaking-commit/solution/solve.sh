#!/bin/bash
# Oracle: bisect between the root commit and main with the self-check, then revert the culprit.
set -euo pipefail
cd /workspace
root=$(git rev-list --max-parents=0 main)
git bisect start main "$root" > /dev/null
git bisect run ./check.sh > /dev/null
bad=$(git rev-parse refs/bisect/bad)
git bisect reset > /dev/null
echo "$bad" > first_bad_commit.txt
git revert --no-edit "$bad" > /dev/null
