#!/bin/bash
set -euo pipefail
cd /workspace
{
    echo "id,full_name,email,city,tags"
    jq -r '.users | map(select(.active == true)) | sort_by(.id) | .[]
           | [(.id | tostring), "\(.name.first) \(.name.last)", (.email // ""), (.address.city // ""),
              ((.tags // []) | join(";"))]
           | @csv' users.json
} > active_users.csv
