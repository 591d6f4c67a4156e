#!/usr/bin/env bash
# After ../shared/tools/fa4-bundle.sh: splits .fa4a/cu13.tar.xz (63.6 MB) into .fa4a/part_aa
# and .fa4c/part_ab, because the tracked tree plus the whole archive is over one device
# call's 64 MiB carry. Then two device calls on one warm machine (30 s idle release):
#   1 (carry [".fa4a"]):  cp .fa4a/part_aa /tmp/fa4_part_aa
#   2 (carry [".fa4c", ".fa4b", ".whl", "out/bench"]):  bash tools/device_bench.sh ...
#      (device_bench.sh unpacks /tmp/fa4_part_aa + .fa4c/part_ab when /tmp/fa4site is missing)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
[ -f .fa4a/cu13.tar.xz ] || { echo "no .fa4a/cu13.tar.xz: run ../shared/tools/fa4-bundle.sh first" >&2; exit 2; }
grep -qxF "/.fa4c/" .git/info/exclude 2>/dev/null || echo "/.fa4c/" >> .git/info/exclude
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
split -b 34M .fa4a/cu13.tar.xz "$tmp/part_"
mkdir -p .fa4c
rm -f .fa4a/cu13.tar.xz .fa4a/part_* .fa4c/part_*
mv "$tmp/part_aa" .fa4a/ && mv "$tmp/part_ab" .fa4c/
du -sh .fa4a .fa4c
