#!/usr/bin/env bash
# The Python client's figures in one run (docs/BENCHMARKS.md, "Python client"):
# the zero-copy read benchmark, then the example engine's loss table over both
# models, every scorer and budget (about 10 minutes on 2 cores).
#   BUILD_DIR   build tree with daemon/kvtierd and client/python (default build/test)
#   OUT         output folder (default bench/out/python)
#   DATA        shared data with models/ and realkv/ (default ../shared/data
#               beside the checkout, else /work/shared/data)
# Extra arguments go to decode_eval.py (e.g. --models copy --budgets 1/8).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$root" && cd "${BUILD_DIR:-build/test}" && pwd)
out=${OUT:-$root/bench/out/python}
data=${DATA:-}
if [[ -z "$data" ]]; then
  if [[ -d "$root/../shared/data/realkv" ]]; then data=$(cd "$root/../shared/data" && pwd); else data=/work/shared/data; fi
fi
for f in "$build/daemon/kvtierd" "$build/client/python/kvtier/v1/kvtier_pb2.py"; do
  [[ -e "$f" ]] || { echo "run.sh: $f missing: build kvtierd and kvtier_python in $build" >&2; exit 1; }
done
mkdir -p "$out"
export PYTHONPATH="$build/client/python"
# Debian's interpreter: it sees python3-grpcio, python3-protobuf and python3-torch.
py=/usr/bin/python3
"$py" "$root/bench/python/zero_copy_bench.py" --kvtierd "$build/daemon/kvtierd" \
  --json "$out/zero_copy.json" | tee "$out/zero_copy.txt"
# The mass scorer's per-model calibrations (kvtier-eval --calibrate).
calibration=()
if [[ -d "$root/bench/quality/calibration" ]]; then
  calibration=(--calibration-dir "$root/bench/quality/calibration")
fi
"$py" "$root/client/python/examples/decode_eval.py" --kvtierd "$build/daemon/kvtierd" \
  --data "$data" --out "$out" "${calibration[@]}" "$@" | tee "$out/decode_eval.txt"
echo "run.sh: results in $out (results.md, results.json, zero_copy.json)"
