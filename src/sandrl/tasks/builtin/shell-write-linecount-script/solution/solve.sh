#!/bin/bash
set -euo pipefail
mkdir -p /workspace/bin
cat > /workspace/bin/linecount.sh <<'SH'
#!/bin/bash
# linecount.sh DIR EXT: line counts of the *.EXT files under DIR, then the total.
set -euo pipefail
export LC_ALL=C
if [[ $# -ne 2 ]]; then
    echo "usage: linecount.sh DIR EXT" >&2
    exit 2
fi
dir=$1 ext=$2
if [[ ! -d $dir ]]; then
    echo "linecount.sh: $dir: not a directory" >&2
    exit 1
fi
total=0
while IFS= read -r -d '' rel; do
    n=$(wc -l < "$dir/$rel")
    printf '%d\t%s\n' "$n" "$rel"
    total=$((total + n))
done < <(cd "$dir" && find . -type f -name "*.$ext" -printf '%P\0' | sort -z)
printf 'total\t%d\n' "$total"
SH
chmod +x /workspace/bin/linecount.sh
