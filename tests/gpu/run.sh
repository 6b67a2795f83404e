#!/usr/bin/env bash
# tests/gpu/run.sh: the GPU suite on a bare GPU machine, in one command.
#
#   tests/gpu/run.sh [--quick | --full] [--time-limit SECONDS]
#
# Builds gpu/, index/ and tests/gpu alone (KVTIER_GPU_ONLY=ON) and runs the
# GPU tests and benchmarks, on a machine that has only the CUDA toolkit,
# CMake >= 3.25, a C++20 compiler and tar, plus the .gpu-debs/ folder of
# GoogleTest and abseil packages carried with the tree (made on a Debian
# machine by tests/gpu/fetch-debs.sh). Without a device everything builds
# and the device tests report SKIPPED; that is how it is checked on CPU
# machines.
#
# Bounded: the whole run stays inside --time-limit (default 480 s): every
# step gets at most what is left minus a reserve for packaging the logs,
# and a step that runs out is reported as such. --quick (the default) runs
# every test and the short benchmark; --full runs the long benchmark too.
#
# Output, under $OUT (default build-gpu/out):
#   kvtier-gpu-summary.txt   the summary printed at the end
#   kvtier-gpu-logs.tar.gz   every log (configure, build, each test, bench)
# Exit status: 0 when nothing failed (skips are not failures), 1 when a
# test, benchmark or step failed, 2 when a prerequisite is missing.
#
# Environment:
#   OUT                    where the summary and the log tarball go
#   KVTIER_GPU_BUILD_DIR   build folder (default <repo>/build-gpu)
#   KVTIER_GPU_JOBS        parallel jobs (default: nproc)
#   KVTIER_GTEST_PREBUILT  1: use the packaged libgtest.a / libgmock.a
#   KVTIER_GPU_ISOLATED    1: hide /usr from CMake's package search, to prove
#                          nothing outside the toolkit and the debs is used
set -uo pipefail

start_s=$(date +%s)
mode=quick
limit_s=480
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) mode=quick ;;
    --full) mode=full ;;
    --time-limit) limit_s="$2"; shift ;;
    --time-limit=*) limit_s="${1#*=}" ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${KVTIER_GPU_BUILD_DIR:-${root}/build-gpu}"
out="${OUT:-${build}/out}"
debs="${root}/.gpu-debs"
prefix="${build}/prefix"
logs="${build}/logs"
jobs="${KVTIER_GPU_JOBS:-$(nproc 2>/dev/null || echo 4)}"
reserve_s=20  # kept back for the summary and the tarball
mkdir -p "${build}" "${out}"
rm -rf "${logs}"
mkdir -p "${logs}"
summary="${logs}/summary.txt"
: >"${summary}"

failed=0
steps=()  # "name|verdict" in order
note() { printf '[run.sh %3ds] %s\n' "$(( $(date +%s) - start_s ))" "$*" | tee -a "${logs}/run.log"; }
# Each step's verdict goes into the summary at once, so a run killed from
# outside still leaves $OUT/kvtier-gpu-summary.txt up to its last step.
record() {
  steps+=("$1|$2")
  write_summary
  cp "${summary}" "${out}/kvtier-gpu-summary.txt" 2>/dev/null
}
left_s() { echo $(( limit_s - reserve_s - ($(date +%s) - start_s) )); }
# Seconds for a step: at most cap, at most what is left.
budget() {
  local left cap="$1"
  left="$(left_s)"
  (( left < cap )) && cap="${left}"
  (( cap < 1 )) && cap=1
  echo "${cap}"
}
# Runs a command under a step budget; 124 means it ran out of time.
bounded() {
  local cap="$1"; shift
  if (( $(left_s) < 2 )); then return 124; fi
  timeout --kill-after=5 "$(budget "${cap}")" "$@"
}

# ---- summary and tarball, whatever happens --------------------------------
write_summary() {
  {
    echo "==================== kvtier GPU suite summary ===================="
    printf '%-36s %s\n' "mode" "${mode}, time limit ${limit_s}s"
    printf '%-36s %s\n' "device" "${device_line:-unknown}"
    for entry in "${steps[@]}"; do
      printf '%-36s %s\n' "${entry%%|*}" "${entry#*|}"
    done
    if [[ -f "${logs}/bench.log" ]]; then
      local ratio
      ratio="$(result "${logs}/bench.log" promotion_bandwidth_ratio)"
      if [[ -n "${ratio}" ]]; then
        printf '%-36s %s (goal >= 0.8: %s)\n' "promotion bandwidth ratio" "${ratio}" \
          "$(goal "${ratio}" '>=' 0.8)"
      fi
    fi
    local select_log="${logs}/kvtier_gpu_select_conformance_test.log"
    if [[ -f "${select_log}" ]] && grep -q '^RESULT select_gpu_us' "${select_log}"; then
      for c in B64_N4096 B1_N65536; do
        printf '%-36s cpu %s us, gpu %s us\n' "Select ${c}" \
          "$(result "${select_log}" "select_cpu_descent_us_${c}")" \
          "$(result "${select_log}" "select_gpu_us_${c}")"
      done
    fi
    printf '%-36s %ss\n' "wall time" "$(( $(date +%s) - start_s ))"
    printf '%-36s %s\n' "result" "$( ((failed)) && echo FAILED || echo OK)"
    echo "=================================================================="
  } >"${summary}"
}
result() { sed -n "s/^RESULT $2=//p" "$1" | tail -n 1; }
goal() {  # value op threshold -> "met" / "NOT met"
  awk -v v="$1" -v t="$3" -v op="$2" 'BEGIN { ok = (op == ">=") ? v >= t : v <= t; print ok ? "met" : "NOT met" }'
}
finish() {
  local rc=$?
  trap - EXIT INT TERM
  ((rc == 2)) || ((rc == 0)) || failed=1
  write_summary
  cat "${summary}"
  cp "${summary}" "${out}/kvtier-gpu-summary.txt"
  tar -czf "${out}/kvtier-gpu-logs.tar.gz" -C "${build}" logs 2>/dev/null ||
    echo "run.sh: could not write ${out}/kvtier-gpu-logs.tar.gz" >&2
  echo "summary: ${out}/kvtier-gpu-summary.txt, logs: ${out}/kvtier-gpu-logs.tar.gz"
  if ((rc == 2)); then exit 2; fi
  exit $((failed ? 1 : 0))
}
trap finish EXIT
trap 'note "interrupted"; record "interrupted" "FAIL (signal)"; failed=1; exit 1' INT TERM
die() { note "ERROR: $*"; record "prerequisites" "MISSING: $*"; exit 2; }

# ---- 0. Prerequisites ------------------------------------------------------
missing=()
nvcc="$(command -v nvcc || true)"
[[ -z "${nvcc}" && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
[[ -n "${nvcc}" ]] || missing+=("nvcc (the CUDA toolkit; PATH or /usr/local/cuda/bin)")
if command -v cmake >/dev/null 2>&1; then
  cmake_version="$(cmake --version | sed -n 's/^cmake version \([0-9.]*\).*/\1/p')"
  if [[ "$(printf '%s\n3.25\n' "${cmake_version}" | sort -V | head -n 1)" != 3.25 ]]; then
    missing+=("CMake >= 3.25 (found ${cmake_version}; the root CMakeLists.txt requires 3.25)")
  fi
else
  missing+=("cmake (>= 3.25)")
fi
cxx="${CXX:-$(command -v c++ || command -v g++ || command -v clang++ || true)}"
[[ -n "${cxx}" ]] || missing+=("a C++20 compiler (c++, g++ or clang++)")
for tool in tar gzip timeout sed awk; do
  command -v "${tool}" >/dev/null 2>&1 || missing+=("${tool}")
done
command -v dpkg >/dev/null 2>&1 || command -v ar >/dev/null 2>&1 ||
  missing+=("dpkg or ar (to unpack .gpu-debs)")
if ! ls "${debs}"/*.deb >/dev/null 2>&1; then
  missing+=("${debs}/*.deb: run tests/gpu/fetch-debs.sh on a Debian machine and carry .gpu-debs with the tree")
fi
if ((${#missing[@]} > 0)); then
  for m in "${missing[@]}"; do note "missing: ${m}"; done
  die "$(IFS=';'; echo "${missing[*]}")"
fi
[[ -n "$(command -v nvcc || true)" ]] || export PATH="$(dirname "${nvcc}"):${PATH}"
note "prerequisites: $(cmake --version | head -n 1), ${nvcc} ($("${nvcc}" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')), ${cxx}, ${jobs} jobs, limit ${limit_s}s"

# The device, if any, and its architecture (compile for it alone).
archs="80;90"
device_line="none visible (device tests will skip)"
if command -v nvidia-smi >/dev/null 2>&1 &&
   smi="$(timeout 20 nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1)" &&
   [[ -n "${smi}" ]]; then
  device_line="${smi}"
  cap="$(echo "${smi}" | awk -F', ' '{print $2}' | tr -d .)"
  [[ "${cap}" =~ ^[0-9]+$ ]] && archs="${cap}"
fi
note "device: ${device_line}; CUDA architectures ${archs}"

# ---- 1. GoogleTest and abseil from the debs ---------------------------------
unpack_deb() {
  local deb="$1"
  if command -v dpkg >/dev/null 2>&1; then
    dpkg -x "${deb}" "${prefix}"
  else
    local tmp
    tmp="$(mktemp -d)"
    (cd "${tmp}" && ar x "${deb}" && tar -xf data.tar.* -C "${prefix}") || return 1
    rm -rf "${tmp}"
  fi
}
if [[ -f "${debs}/SHA256SUMS" ]] && command -v sha256sum >/dev/null 2>&1; then
  (cd "${debs}" && sha256sum --quiet -c SHA256SUMS) >"${logs}/debs.log" 2>&1 ||
    die "checksums in ${debs}/SHA256SUMS do not match (see logs/debs.log)"
fi
rm -rf "${prefix}"
mkdir -p "${prefix}"
for deb in "${debs}"/*.deb; do
  unpack_deb "${deb}" >>"${logs}/debs.log" 2>&1 || die "cannot unpack ${deb}"
done
record "debs" "unpacked $(ls "${debs}"/*.deb | wc -l)"
note "unpacked $(ls "${debs}"/*.deb | wc -l) debs into ${prefix}"

generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
gtest_dir=""
if [[ "${KVTIER_GTEST_PREBUILT:-0}" != 1 && -f "${prefix}/usr/src/googletest/CMakeLists.txt" ]]; then
  note "building GoogleTest from the packaged sources"
  if bounded 120 cmake -S "${prefix}/usr/src/googletest" -B "${build}/gtest-build" "${generator[@]}" \
        -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="${build}/gtest" -DBUILD_GMOCK=ON \
        -DINSTALL_GTEST=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
        >"${logs}/gtest-configure.log" 2>&1 &&
     bounded 180 cmake --build "${build}/gtest-build" -j "${jobs}" >"${logs}/gtest-build.log" 2>&1 &&
     cmake --install "${build}/gtest-build" >"${logs}/gtest-install.log" 2>&1; then
    gtest_dir="$(dirname "$(find "${build}/gtest" -name GTestConfig.cmake | head -n 1)")"
    record "GoogleTest" "built from source"
  else
    note "GoogleTest source build failed (logs/gtest-*.log); trying the prebuilt libraries"
  fi
fi
if [[ -z "${gtest_dir}" || "${gtest_dir}" == . ]]; then
  gtest_dir="$(dirname "$(find "${prefix}" -name GTestConfig.cmake | head -n 1)")"
  record "GoogleTest" "prebuilt from the debs"
fi
[[ -f "${gtest_dir}/GTestConfig.cmake" ]] || die "no GTestConfig.cmake from the debs"
absl_dir="$(dirname "$(find "${prefix}" -name abslConfig.cmake | head -n 1)")"
# Every test links abseil (tests/testutil/status_matchers.h) and index/
# needs it: the debs must carry libabsl-dev (fetch-debs.sh downloads it).
[[ -f "${absl_dir}/abslConfig.cmake" ]] || die "no abslConfig.cmake from the debs (libabsl-dev)"
absl_args=(-Dabsl_DIR="${absl_dir}")
export LD_LIBRARY_PATH="${prefix}/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"

# ---- 2. Configure and build gpu/, index/ and tests/gpu -----------------------
isolation=()
if [[ "${KVTIER_GPU_ISOLATED:-0}" == 1 ]]; then
  isolation=(-DCMAKE_IGNORE_PREFIX_PATH=/usr -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
fi
note "configuring"
if ! bounded 120 cmake -S "${root}" -B "${build}/kvtier" "${generator[@]}" \
    -DKVTIER_GPU_ONLY=ON -DKVTIER_WITH_CUDA=ON -DKVTIER_BUILD_TESTS=ON \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="${nvcc}" -DCMAKE_CXX_COMPILER="${cxx}" \
    -DKVTIER_CUDA_ARCHITECTURES="${archs}" -DGTest_DIR="${gtest_dir}" "${absl_args[@]}" \
    "${isolation[@]}" >"${logs}/configure.log" 2>&1; then
  tail -n 30 "${logs}/configure.log"
  record "configure" "FAIL (logs/configure.log)"
  failed=1
  exit 1
fi
record "configure" "ok"
note "building with ${jobs} jobs"
bounded 360 cmake --build "${build}/kvtier" -j "${jobs}" >"${logs}/build.log" 2>&1
build_rc=$?
if ((build_rc != 0)); then
  grep -E "error|Error" "${logs}/build.log" | head -n 30
  record "build" "$( ((build_rc == 124)) && echo "FAIL (out of time)" || echo "FAIL (logs/build.log)")"
  failed=1
  exit 1
fi
record "build" "ok ($(( $(date +%s) - start_s ))s into the run)"
note "built"

# ---- 3. Tests and benchmarks ---------------------------------------------------
bin="${build}/kvtier/tests/gpu"
counts() {  # passed skipped failed of a gtest log
  local log="$1"
  printf '%s %s %s' \
    "$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "${log}" | tail -n 1)" \
    "$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "${log}" | tail -n 1)" \
    "$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "${log}" | tail -n 1)"
}
run_test() {
  local name="$1" label="$2" cap="$3" log="${logs}/$1.log"
  if [[ ! -x "${bin}/${name}" ]]; then
    record "${label}" "not built (no abseil in the debs?)"
    return
  fi
  bounded "${cap}" "${bin}/${name}" --gtest_color=no >"${log}" 2>&1
  local rc=$?
  read -r passed skipped failures <<<"$(counts "${log}")"
  local verdict
  if ((rc == 124)); then
    verdict="FAIL (out of time after $(budget "${cap}")s)"
  elif ((rc != 0)); then
    verdict="FAIL (rc ${rc}; ${failures:-?} failed; logs/${name}.log)"
    grep -E "^\[  FAILED  \]|Failure" "${log}" | head -n 10
  elif [[ "${passed:-0}" == 0 && "${skipped:-0}" != 0 ]]; then
    verdict="SKIPPED (${skipped} skipped: no device)"
  else
    verdict="PASS (${passed:-0} passed${skipped:+, ${skipped} skipped})"
  fi
  [[ "${verdict}" == FAIL* ]] && failed=1
  record "${label}" "${verdict}"
  note "${label}: ${verdict}"
}
run_test kvtier_gpu_probe_test "device probe" 30
run_test kvtier_gpu_reference_test "CPU references" 30
run_test kvtier_device_ops_conformance_test "DeviceOps conformance (shm + cuda)" 90
run_test kvtier_cuda_device_ops_test "CUDA device ops / factory / shapes" 60
run_test kvtier_gpu_kernel_test "kernel == CPU reference" 120
run_test kvtier_gpu_ipc_test "IPC bit-exact (second process)" 60
run_test kvtier_gpu_select_conformance_test "Select: GPU == CPU" 120

bench_args=()
[[ "${mode}" == quick ]] && bench_args=(--quick)
note "benchmark (${mode})"
bounded $([[ "${mode}" == quick ]] && echo 90 || echo 240) "${bin}/kvtier_gpu_bench" "${bench_args[@]}" \
  >"${logs}/bench.log" 2>&1
bench_rc=$?
cat "${logs}/bench.log"
if ((bench_rc == 0)); then
  if grep -q '^SKIPPED' "${logs}/bench.log"; then
    record "benchmark" "SKIPPED (no device)"
  else
    record "benchmark" "ok (logs/bench.log)"
  fi
else
  record "benchmark" "FAIL ($( ((bench_rc == 124)) && echo "out of time" || echo "rc ${bench_rc}"))"
  failed=1
fi
exit 0
