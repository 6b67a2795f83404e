#!/usr/bin/env bash
# Installs every Debian package kvtier needs to build, test and benchmark.
# Idempotent and non-interactive: packages already present are skipped, so a
# second run does no network access at all.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config git
  # Debian packages (deploy/package.sh, the package test)
  dpkg-dev fakeroot lintian
  # RPC and serialization
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  # storage (hiredis: the remote tier's Redis Cluster client)
  librocksdb-dev liburing-dev libxxhash-dev libhiredis-dev
  # base libraries
  libabsl-dev libssl-dev libsystemd-dev libtomlplusplus-dev libcli11-dev libspdlog-dev libfmt-dev
  nlohmann-json3-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev libfaiss-dev
  redis-server fio prometheus python3-matplotlib
  # the Austen novels (bench/quality/make_dumps.py's text; pulls in R's core)
  r-cran-janeaustenr
  # fuzzing (tests/fuzz): clang, and libFuzzer with the sanitizer runtimes
  clang libclang-rt-14-dev
  # format and lint (deploy/lint.sh, the Python package's type check)
  clang-format clang-tidy mypy
  # python client
  python3 python3-grpcio python3-protobuf python3-numpy python3-torch
  # `pip install client/python` into a venv, offline (ctest python.install)
  python3-venv python3-pip python3-setuptools python3-wheel
  # an optimised BLAS for torch and numpy (the reference BLAS is ~10x slower)
  libopenblas0-pthread
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
