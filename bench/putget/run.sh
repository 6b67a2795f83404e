#!/usr/bin/env bash
# kvtierd Put/Get throughput vs memcpy and redis-server, both block sizes in
# one run of kvtier_putget_bench, plus a PNG bar chart when matplotlib is
# available (apt-get install python3-matplotlib).
#
# Usage: bench/putget/run.sh [-b BUILD_DIR] [-o OUT_DIR] [-s "256KiB,2MiB"]
#                            [-t TOTAL] [-k BATCH] [-r REPS] [-- extra flags]
# Writes OUT_DIR/results.md, results.csv, metadata.csv, putget.png
# (default OUT_DIR: bench/out/putget, git-ignored).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD="$ROOT/build"
OUT="$ROOT/bench/out/putget"
SIZES="256KiB,2MiB"
TOTAL=512MiB
BATCH=16
REPS=5
while getopts "b:o:s:t:k:r:h" opt; do
  case $opt in
    b) BUILD=$OPTARG ;;
    o) OUT=$OPTARG ;;
    s) SIZES=$OPTARG ;;
    t) TOTAL=$OPTARG ;;
    k) BATCH=$OPTARG ;;
    r) REPS=$OPTARG ;;
    *) sed -n 2,10p "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))

BENCH="$BUILD/bench/putget/kvtier_putget_bench"
[[ -x "$BENCH" ]] || { echo "missing $BENCH (build target kvtier_putget_bench)" >&2; exit 1; }
mkdir -p "$OUT"
"$BENCH" --block-sizes "$SIZES" --total "$TOTAL" --batch-blocks "$BATCH" --reps "$REPS" \
  --out-dir "$OUT" "$@"

# The first python3 that has matplotlib (a pyenv shim may hide Debian's).
PY=""
for candidate in python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c "import matplotlib" 2>/dev/null; then
    PY=$candidate
    break
  fi
done
if [[ -n "$PY" ]]; then
  "$PY" "$ROOT/bench/putget/plot.py" "$OUT/results.csv" "$OUT/putget.png"
  echo "chart: $OUT/putget.png" >&2
else
  echo "python3-matplotlib not installed: no chart (apt-get install python3-matplotlib)" >&2
fi
