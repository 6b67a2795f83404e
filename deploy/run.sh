#!/usr/bin/env bash
# Starts kvtierd in the foreground on its embedded default configuration:
# data under ./var/kvtier, Unix socket ./var/kvtier/kvtierd.sock, TCP off.
# Installs missing Debian packages and builds (Release) first: the daemon,
# kvtierctl and the Python package (build/release/client/python).
# Extra arguments go to kvtierd, e.g. deploy/run.sh --set log.level=debug
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh
BUILD_DIR=${KVTIER_BUILD_DIR:-build/release}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_BENCH=OFF >/dev/null
cmake --build "$BUILD_DIR" --target kvtierd kvtierctl kvtier_python
echo "run.sh: starting kvtierd; in another shell: $BUILD_DIR/client/kvtierctl status"
exec "$BUILD_DIR/daemon/kvtierd" "$@"
