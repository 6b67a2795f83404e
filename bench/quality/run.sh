#!/usr/bin/env bash
# Runs kvtier-eval (built beforehand; this script builds nothing) on the
# shared realkv dumps and draws the plots.
#
# usage: bench/quality/run.sh [OUT_DIR] [kvtier-eval args...]
#   OUT_DIR defaults to bench/out/quality; BUILD_DIR (default: build) is
#   where kvtier-eval was built. Extra arguments go to kvtier-eval, e.g.
#   BUILD_DIR=build-quality bench/quality/run.sh /tmp/q --max-steps 64
# Writes results.csv, claims.csv, quality.md, run.txt and, when
# python3-matplotlib is installed, recall_vs_budget.png and
# churn_vs_window.png into OUT_DIR.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out_dir=${1:-$root/bench/out/quality}
[[ $# -gt 0 ]] && shift
build_dir=${BUILD_DIR:-build}
[[ "$build_dir" = /* ]] || build_dir="$root/$build_dir"
bin="$build_dir/bench/quality/kvtier-eval"
if [[ ! -x "$bin" ]]; then
  echo "$bin not found: build the kvtier-eval target first" >&2
  exit 1
fi
mkdir -p "$out_dir"
# The shared dumps sit beside the checkout (../shared/data/realkv).
data_args=()
if [[ -d "$root/../shared/data/realkv" ]]; then
  data_args=(--data "$(cd "$root/../shared/data/realkv" && pwd)")
fi
"$bin" --out "$out_dir" "${data_args[@]}" "$@" | tee "$out_dir/run.txt"
# The first python3 that has matplotlib (a pyenv python3 on PATH may not see
# Debian's python3-matplotlib).
for py in python3 /usr/bin/python3; do
  if "$py" -c "import matplotlib" 2>/dev/null; then
    "$py" "$here/plot.py" "$out_dir/results.csv" "$out_dir"
    echo "plots in $out_dir"
    exit 0
  fi
done
echo "python3-matplotlib is not installed: no plots written" >&2
