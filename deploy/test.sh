#!/usr/bin/env bash
# Installs missing Debian packages, builds everything (tests and benchmarks
# included) and runs the whole test suite with ctest.
# KVTIER_BUILD_DIR (default build/test) and KVTIER_JOBS (default: cores)
# may be set.
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh
BUILD_DIR=${KVTIER_BUILD_DIR:-build/test}
JOBS=${KVTIER_JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVTIER_BUILD_TESTS=ON -DKVTIER_BUILD_BENCH=ON
cmake --build "$BUILD_DIR" -j "$JOBS"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 300
# Format check of every C++ file and clang-tidy on the files the last commit
# changed (deploy/lint.sh; findings beyond deploy/lint-baseline.txt fail).
bash deploy/lint.sh --build-dir "$BUILD_DIR" --jobs "$JOBS"
