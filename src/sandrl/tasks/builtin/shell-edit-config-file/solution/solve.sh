#!/bin/bash
# Oracle: one awk pass that tracks the current section.
set -euo pipefail
cd /workspace
awk '
    /^\[.*\][ \t]*$/ { section = substr($0, 2, index($0, "]") - 2) }
    section == "legacy" { next }
    section == "server" && /^port[ \t]*=/ { print "port = 8080"; next }
    section == "logging" && $0 == "# level = debug" { print "level = info"; next }
    { print }
' app.conf > app.conf.new
mv app.conf.new app.conf
