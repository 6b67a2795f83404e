#!/usr/bin/env bash
# Runs kvtier_placement_bench (built beforehand; this script builds
# nothing) on the shared realkv dumps and draws the plot.
#
# usage: bench/placement/run.sh [OUT_DIR] [kvtier_placement_bench args...]
#   OUT_DIR defaults to bench/out/placement; BUILD_DIR (default: build) is
#   where the bench was built, e.g.
#   BUILD_DIR=build/placement bench/placement/run.sh
# Writes placement.csv, placement.md, run.txt and, when python3-matplotlib
# is installed, placement.png into OUT_DIR.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out_dir=${1:-$root/bench/out/placement}
[[ $# -gt 0 ]] && shift
build_dir=${BUILD_DIR:-build}
[[ "$build_dir" = /* ]] || build_dir="$root/$build_dir"
bin="$build_dir/bench/placement/kvtier_placement_bench"
if [[ ! -x "$bin" ]]; then
  echo "$bin not found: build the kvtier_placement_bench target first" >&2
  exit 1
fi
mkdir -p "$out_dir"
data_args=()
if [[ -d "$root/../shared/data/realkv" ]]; then
  data_args=(--data "$(cd "$root/../shared/data/realkv" && pwd)")
fi
start=$(date +%s)
"$bin" --out "$out_dir" "${data_args[@]}" "$@" 2>&1 | tee "$out_dir/run.txt"
echo "wall time $(( $(date +%s) - start )) s" | tee -a "$out_dir/run.txt"
for py in python3 /usr/bin/python3; do
  if "$py" -c "import matplotlib" 2>/dev/null; then
    "$py" "$here/plot.py" "$out_dir/placement.csv" "$out_dir/placement.png"
    echo "plot: $out_dir/placement.png"
    exit 0
  fi
done
echo "python3-matplotlib is not installed: no plot written" >&2
