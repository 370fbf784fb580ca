#!/bin/bash
set -euo pipefail
cd /workspace
fix=$(git log --format=%H --grep='^Fix parse_range dropping the last page of a range$' main)
git checkout -q release-1.2
git cherry-pick -x "$fix" > /dev/null
