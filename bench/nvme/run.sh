#!/usr/bin/env bash
# NvmeTier vs fio on the same directory, block sizes and queue depth.
#
# For each block size: fio sequential write then read (ioengine=io_uring,
# direct=1, one job, iodepth=QD, size=TOTAL, end_fsync=1), once with fio's
# defaults and once with --fixedbufs --registerfiles (registered buffers, as
# the tier uses); and kvtier_nvme_bench with the same size, depth and
# directory (write + Sync, then read back with XXH3 verification), with
# in-place (aligned) buffers and with staged (unaligned) buffers. Each
# measurement is repeated REPEATS times and the best run kept, for every
# tool alike. Ratios are taken against the faster fio variant. Also reports
# CPU seconds per GiB (user + system, whole process) of the fastest runs.
# Prints a markdown table.
#
# Usage: bench/nvme/run.sh [-b BUILD_DIR] [-d DATA_DIR] [-q QD] [-t TOTAL]
#                          [-s "256K 2M"] [-r REPEATS]
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD="$ROOT/build"
DATA="${TMPDIR:-/tmp}/kvtier-nvme-bench"
QD=32
TOTAL=1G
SIZES="256K 2M"
REPEATS=3
while getopts "b:d:q:t:s:r:h" opt; do
  case $opt in
    b) BUILD=$OPTARG ;;
    d) DATA=$OPTARG ;;
    q) QD=$OPTARG ;;
    t) TOTAL=$OPTARG ;;
    s) SIZES=$OPTARG ;;
    r) REPEATS=$OPTARG ;;
    *) sed -n 2,16p "$0"; exit 2 ;;
  esac
done

BENCH="$BUILD/bench/nvme/kvtier_nvme_bench"
[[ -x "$BENCH" ]] || { echo "missing $BENCH (build target kvtier_nvme_bench)" >&2; exit 1; }
command -v fio >/dev/null || { echo "fio not installed" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 needed to read fio's JSON" >&2; exit 1; }
mkdir -p "$DATA/fio" "$DATA/kvtier"
trap 'rm -rf "$DATA/fio" "$DATA/kvtier"' EXIT

bytes() { numfmt --from=iec "$1"; }  # 256K -> 262144

# Keeps the faster of two "GiB/s CPU-s/GiB" pairs.
best() {
  awk -v a="$1" -v b="$2" 'BEGIN {
    split(a, x, " "); split(b, y, " "); print (x[1] >= y[1]) ? a : b }'
}

# fio_run write|read BS [extra fio flags] -> "GiB/s CPU-s/GiB"
fio_run() {
  local rw=$1 bs=$2 out
  shift 2
  [[ $rw == write ]] && rm -f "$DATA/fio/fio.dat"
  out=$(fio --name=nvme --filename="$DATA/fio/fio.dat" --ioengine=io_uring \
        --direct=1 --rw="$rw" --bs="$bs" --iodepth="$QD" --size="$TOTAL" \
        --numjobs=1 --end_fsync=1 "$@" --output-format=json)
  python3 -c '
import json, sys
job = json.loads(sys.stdin.read())["jobs"][0]
side = job[sys.argv[1]]
gib = side["io_bytes"] / 2**30
cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100 * side["runtime"] / 1000
print("%.3f %.3f" % (side["bw_bytes"] / 2**30, cpu_s / gib))' "$rw" <<<"$out"
}

# kv_run BS aligned|unaligned -> two lines "GiB/s CPU-s/GiB": write, read
kv_run() {
  local bs=$1 buffers=$2 out
  out=$("$BENCH" --dir "$DATA" --block-size "$(bytes "$bs")" \
        --total-bytes "$(bytes "$TOTAL")" --queue-depth "$QD" \
        --buffers "$buffers")
  echo "$out" >&2
  for op in write read; do
    sed -n "s/^RESULT kvtier op=$op .* gibps=\([0-9.]*\) cpu_s_per_gib=\([0-9.]*\).*/\1 \2/p" <<<"$out"
  done
}

echo "kvtier NVMe tier vs fio: dir=$DATA ($(df -T "$DATA" | awk 'NR==2 {print $2}')), qd=$QD, total=$TOTAL, best of $REPEATS, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
FIXED=(--fixedbufs --registerfiles)
declare -A R  # R[tool,op,bs] = "GiB/s CPU-s/GiB"
for bs in $SIZES; do
  for key in fio fiof kv kvs; do R[$key,write,$bs]="0 0"; R[$key,read,$bs]="0 0"; done
  for ((i = 0; i < REPEATS; i++)); do
    R[fio,write,$bs]=$(best "${R[fio,write,$bs]}" "$(fio_run write "$bs")")
    R[fio,read,$bs]=$(best "${R[fio,read,$bs]}" "$(fio_run read "$bs")")
    R[fiof,write,$bs]=$(best "${R[fiof,write,$bs]}" "$(fio_run write "$bs" "${FIXED[@]}")")
    R[fiof,read,$bs]=$(best "${R[fiof,read,$bs]}" "$(fio_run read "$bs" "${FIXED[@]}")")
    for mode in aligned unaligned; do
      key=kv; [[ $mode == unaligned ]] && key=kvs
      { read -r w; read -r r; } < <(kv_run "$bs" "$mode")
      R[$key,write,$bs]=$(best "${R[$key,write,$bs]}" "$w")
      R[$key,read,$bs]=$(best "${R[$key,read,$bs]}" "$r")
    done
  done
done

gbps() { cut -d' ' -f1 <<<"$1"; }
cpu() { cut -d' ' -f2 <<<"$1"; }
echo
echo "| block | op | fio GiB/s | fio fixedbufs GiB/s | kvtier in-place GiB/s | ratio | kvtier staged GiB/s | ratio | goal | met (in-place) | CPU s/GiB fio fixedbufs / kvtier in-place / staged |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for bs in $SIZES; do
  for op in read write; do
    goal=0.90; [[ $op == write ]] && goal=0.85
    f=$(gbps "${R[fio,$op,$bs]}"); ff=$(gbps "${R[fiof,$op,$bs]}")
    k=$(gbps "${R[kv,$op,$bs]}"); ks=$(gbps "${R[kvs,$op,$bs]}")
    awk -v bs="$bs" -v op="$op" -v f="$f" -v ff="$ff" -v k="$k" -v ks="$ks" \
        -v goal="$goal" -v c1="$(cpu "${R[fiof,$op,$bs]}")" \
        -v c2="$(cpu "${R[kv,$op,$bs]}")" -v c3="$(cpu "${R[kvs,$op,$bs]}")" 'BEGIN {
      anchor = (f > ff) ? f : ff
      r1 = (anchor > 0) ? k / anchor : 0; r2 = (anchor > 0) ? ks / anchor : 0
      printf "| %s | %s | %s | %s | %s | %.2f | %s | %.2f | >= %s | %s | %s / %s / %s |\n",
        bs, op, f, ff, k, r1, ks, r2, goal, (r1 >= goal) ? "yes" : "**no**", c1, c2, c3 }'
  done
done
echo "(ratios against the faster fio column; best of $REPEATS runs each)"
