#!/usr/bin/env bash
# Builds gpu/ and tests/gpu alone (KVTIER_GPU_ONLY=ON) on a GPU machine that
# has only the CUDA toolkit, CMake, a C++ compiler (and usually ninja), runs
# the GPU suite and the microbenchmark, and prints a summary:
#   kernel == CPU reference, IPC bit-exact, promotion bandwidth ratio,
#   scoring + top-K microseconds.
# Without a device everything builds and the tests report SKIPPED.
#
# GoogleTest comes from the .deb files tests/gpu/fetch-debs.sh put in
# .gpu-debs/ (unpacked with dpkg -x, or ar + tar): the googletest sources are
# built with this machine's compiler; KVTIER_GTEST_PREBUILT=1 uses the
# packaged static libraries instead (same distribution only).
#
# Environment:
#   KVTIER_GPU_BUILD_DIR   build folder (default <repo>/build-gpu)
#   KVTIER_GPU_JOBS        parallel jobs (default: nproc)
#   KVTIER_GTEST_PREBUILT  1: use the packaged libgtest.a / libgmock.a
#   KVTIER_GPU_BENCH_ARGS  extra arguments for kvtier_gpu_bench (e.g. --quick)
#   KVTIER_GPU_ISOLATED    1: hide /usr from CMake's package search, to prove
#                          nothing outside the toolkit and the debs is used
# Exit status: 0 when nothing failed (skips are not failures).
set -uo pipefail

start_s=$(date +%s)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${KVTIER_GPU_BUILD_DIR:-${root}/build-gpu}"
debs="${root}/.gpu-debs"
prefix="${build}/prefix"
logs="${build}/logs"
jobs="${KVTIER_GPU_JOBS:-$(nproc 2>/dev/null || echo 4)}"
mkdir -p "${build}" "${logs}"

failed=0
note() { printf '[run.sh %3ds] %s\n' "$(( $(date +%s) - start_s ))" "$*"; }
die() { note "ERROR: $*"; exit 2; }

# ---- 1. GoogleTest from the debs --------------------------------------
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

ls "${debs}"/*.deb >/dev/null 2>&1 || die "no .deb files in ${debs}: run tests/gpu/fetch-debs.sh on a Debian machine first"
if [[ -f "${debs}/SHA256SUMS" ]] && command -v sha256sum >/dev/null 2>&1; then
  (cd "${debs}" && sha256sum --quiet -c SHA256SUMS) || die "checksums in ${debs}/SHA256SUMS do not match"
fi
rm -rf "${prefix}"
mkdir -p "${prefix}"
for deb in "${debs}"/*.deb; do
  unpack_deb "${deb}" || die "cannot unpack ${deb}"
done
note "unpacked $(ls "${debs}"/*.deb | wc -l) debs into ${prefix}"

generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi

gtest_dir=""
if [[ "${KVTIER_GTEST_PREBUILT:-0}" != 1 && -f "${prefix}/usr/src/googletest/CMakeLists.txt" ]]; then
  note "building GoogleTest from the packaged sources"
  if timeout 120 cmake -S "${prefix}/usr/src/googletest" -B "${build}/gtest-build" "${generator[@]}" \
        -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="${build}/gtest" -DBUILD_GMOCK=ON \
        -DINSTALL_GTEST=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON >"${logs}/gtest-configure.log" 2>&1 &&
     timeout 180 cmake --build "${build}/gtest-build" -j "${jobs}" >"${logs}/gtest-build.log" 2>&1 &&
     cmake --install "${build}/gtest-build" >"${logs}/gtest-install.log" 2>&1; then
    gtest_dir="$(dirname "$(find "${build}/gtest" -name GTestConfig.cmake | head -n 1)")"
  else
    note "GoogleTest source build failed (see ${logs}/gtest-*.log); trying the prebuilt libraries"
  fi
fi
if [[ -z "${gtest_dir}" || "${gtest_dir}" == . ]]; then
  gtest_dir="$(dirname "$(find "${prefix}" -name GTestConfig.cmake | head -n 1)")"
fi
[[ -f "${gtest_dir}/GTestConfig.cmake" ]] || die "no GTestConfig.cmake from the debs"
note "GoogleTest: ${gtest_dir}"

# ---- 2. Configure and build gpu/ + tests/gpu only ----------------------
isolation=()
if [[ "${KVTIER_GPU_ISOLATED:-0}" == 1 ]]; then
  isolation=(-DCMAKE_IGNORE_PREFIX_PATH=/usr -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
fi
note "configuring ($(cmake --version | head -n 1), generator ${generator[*]:-default})"
timeout 120 cmake -S "${root}" -B "${build}/kvtier" "${generator[@]}" \
  -DKVTIER_GPU_ONLY=ON -DKVTIER_WITH_CUDA=ON -DKVTIER_BUILD_TESTS=ON \
  -DCMAKE_BUILD_TYPE=Release -DGTest_DIR="${gtest_dir}" "${isolation[@]}" \
  >"${logs}/configure.log" 2>&1 || { tail -n 30 "${logs}/configure.log"; die "configure failed"; }
note "building with ${jobs} jobs"
timeout 420 cmake --build "${build}/kvtier" -j "${jobs}" >"${logs}/build.log" 2>&1 ||
  { grep -E "error|Error" "${logs}/build.log" | head -n 30; die "build failed (${logs}/build.log)"; }
note "built"

# ---- 3. Run the suite ----------------------------------------------------
bin="${build}/kvtier/tests/gpu"
declare -A verdict
run_test() {
  local name="$1" log="${logs}/$1.log"
  timeout 120 "${bin}/${name}" --gtest_color=no >"${log}" 2>&1
  local rc=$?
  local passed skipped
  passed="$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "${log}" | tail -n 1)"
  skipped="$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "${log}" | tail -n 1)"
  if [[ ${rc} -ne 0 ]]; then
    verdict[${name}]=FAIL
    failed=1
    note "${name}: FAILED (rc ${rc}, ${log})"
    grep -E "^\[  FAILED  \]|Failure|rror" "${log}" | head -n 10
  else
    verdict[${name}]=PASS
    note "${name}: passed ${passed:-0}, skipped ${skipped:-0}"
  fi
}
# Outcome of one test case from a binary's log: PASS, FAIL, SKIPPED or ?.
case_verdict() {
  local log="${logs}/$1.log" test="$2"
  if grep -q "^\[       OK \] ${test} " "${log}" 2>/dev/null; then echo PASS
  elif grep -q "^\[  SKIPPED \] ${test} " "${log}" 2>/dev/null; then echo "SKIPPED (no device)"
  elif grep -q "^\[  FAILED  \] ${test} " "${log}" 2>/dev/null; then echo FAIL
  else echo "? (see ${log})"; fi
}
# Summary of a whole binary: PASS when all ran and passed, SKIPPED when
# every test skipped, FAIL otherwise.
suite_verdict() {
  local log="${logs}/$1.log"
  if [[ "${verdict[$1]:-FAIL}" == FAIL ]]; then echo FAIL; return; fi
  local passed skipped
  passed="$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "${log}" | tail -n 1)"
  skipped="$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "${log}" | tail -n 1)"
  if [[ "${passed:-0}" == 0 && "${skipped:-0}" != 0 ]]; then echo "SKIPPED (no device)"
  elif [[ "${skipped:-0}" != 0 ]]; then echo "PASS (${passed} passed, ${skipped} skipped)"
  else echo "PASS (${passed} passed)"; fi
}

for t in kvtier_gpu_probe_test kvtier_gpu_reference_test kvtier_device_ops_conformance_test \
         kvtier_cuda_device_ops_test kvtier_gpu_kernel_test kvtier_gpu_ipc_test; do
  run_test "${t}"
done

note "microbenchmark"
timeout 120 "${bin}/kvtier_gpu_bench" ${KVTIER_GPU_BENCH_ARGS:-} >"${logs}/bench.log" 2>&1
bench_rc=$?
cat "${logs}/bench.log"
[[ ${bench_rc} -eq 0 ]] || { failed=1; note "kvtier_gpu_bench failed (rc ${bench_rc})"; }
result() { sed -n "s/^RESULT $1=//p" "${logs}/bench.log" | tail -n 1; }

# ---- 4. Summary ----------------------------------------------------------
probe="$(sed -n 's/^device: //p' "${logs}/bench.log" | head -n 1)"
ratio="$(result promotion_bandwidth_ratio)"
select_us="$(result score_topk_us)"
goal() {  # value op threshold -> "met" / "NOT met"
  awk -v v="$1" -v t="$3" -v op="$2" 'BEGIN { ok = (op == ">=") ? v >= t : v <= t; print ok ? "met" : "NOT met" }'
}
echo
echo "==================== kvtier GPU suite summary ===================="
printf '%-34s %s\n' "device" "${probe:-none: $(grep -m 1 SKIPPED "${logs}/bench.log" || echo unknown)}"
printf '%-34s %s\n' "DeviceOps conformance (shm + cuda)" "$(suite_verdict kvtier_device_ops_conformance_test)"
printf '%-34s %s\n' "CUDA device ops / factory" "$(suite_verdict kvtier_cuda_device_ops_test)"
printf '%-34s %s\n' "kernel == CPU reference" "$(suite_verdict kvtier_gpu_kernel_test)"
printf '%-34s %s\n' "IPC bit-exact (second process)" \
  "$(case_verdict kvtier_gpu_ipc_test IpcTest.SecondProcessReadsBlockBitExact)"
if [[ -n "${ratio}" ]]; then
  printf '%-34s %s (goal >= 0.8: %s)\n' "promotion bandwidth ratio" "${ratio}" "$(goal "${ratio}" '>=' 0.8)"
else
  printf '%-34s %s\n' "promotion bandwidth ratio" "not measured"
fi
if [[ -n "${select_us}" ]]; then
  printf '%-34s %s us (goal <= 20: %s)\n' "scoring + top-K, 64K x D=128, B=1" "${select_us}" \
    "$(goal "${select_us}" '<=' 20)"
else
  printf '%-34s %s\n' "scoring + top-K, 64K x D=128, B=1" "not measured"
fi
graph_us="$(result score_topk_graph_us_fp32_B1_K1024)"
printf '%-34s %s\n' "  the same, as a CUDA graph" "${graph_us:-not measured}${graph_us:+ us}"
printf '%-34s %ss\n' "wall time" "$(( $(date +%s) - start_s ))"
printf '%-34s %s\n' "logs" "${logs}"
echo "=================================================================="
exit ${failed}
