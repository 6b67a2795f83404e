#!/usr/bin/env bash
# Builds the Debian packages of a build tree and lints them.
#
#   deploy/package.sh [BUILD_DIR]     (default: build/release, what run.sh builds)
#
# Configures BUILD_DIR as deploy/run.sh does when it does not exist yet,
# builds it (nothing to do when it is up to date) and runs cpack
# (cmake/KvtierPackaging.cmake) on it: kvtierd, libkvtier-client0,
# libkvtier-client-dev and python3-kvtier .deb files in BUILD_DIR/packages,
# then lintian on them (an error fails the script).
# Install with: apt install ./BUILD_DIR/packages/kvtierd_*.deb
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh
BUILD_DIR=${1:-${KVTIER_BUILD_DIR:-build/release}}
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_BENCH=OFF >/dev/null
fi
# cpack installs every component from this tree (it builds "all" first,
# as `cmake --install` does): build it now, a no-op when it is up to date.
cmake --build "$BUILD_DIR"
rm -rf "$BUILD_DIR/packages"
cpack --config "$BUILD_DIR/CPackConfig.cmake" -B "$BUILD_DIR/packages"
rm -rf "$BUILD_DIR/packages/_CPack_Packages"
lintian --fail-on error "$BUILD_DIR"/packages/*.deb
echo "package.sh: $(ls "$BUILD_DIR"/packages/*.deb | tr '\n' ' ')"
