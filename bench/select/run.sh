#!/usr/bin/env bash
# Runs kvtier_select_bench (built beforehand; this script builds nothing) and
# writes select_bench.csv, select_memory.csv, select_bench.txt and, when
# python3-matplotlib is installed, select_bench.png into OUT_DIR.
#
# usage: bench/select/run.sh OUT_DIR [bench args...]
#   BUILD_DIR (default: build) is where the binary was built.
#   Example: BUILD_DIR=build bench/select/run.sh /tmp/select --queries 20
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 OUT_DIR [--quick] [--queries N] [--hnsw-all]" >&2
  exit 2
fi
out_dir=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build_dir=${BUILD_DIR:-build}
[[ "$build_dir" = /* ]] || build_dir="$root/$build_dir"
bin="$build_dir/bench/select/kvtier_select_bench"
if [[ ! -x "$bin" ]]; then
  echo "$bin not found: build the kvtier_select_bench target first" >&2
  exit 1
fi
mkdir -p "$out_dir"
"$bin" --out "$out_dir" "$@" | tee "$out_dir/select_bench.txt"
# The first python3 that has matplotlib (a pyenv python3 on PATH may not see
# Debian's python3-matplotlib).
for py in python3 /usr/bin/python3; do
  if "$py" -c "import matplotlib" 2>/dev/null; then
    "$py" "$here/plot.py" "$out_dir/select_bench.csv" "$out_dir/select_bench.png"
    exit 0
  fi
done
echo "python3-matplotlib is not installed: no plot written" >&2
