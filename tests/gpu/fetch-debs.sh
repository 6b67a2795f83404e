#!/usr/bin/env bash
# Downloads the GoogleTest Debian packages that tests/gpu/run.sh needs on a
# GPU machine without network access, into the git-ignored .gpu-debs/ at the
# repository root (it travels with the working tree):
#   googletest     sources (run.sh builds them with the GPU machine's compiler)
#   libgtest-dev   headers, static libraries and CMake config (prebuilt fallback)
#   libgmock-dev   the same for gMock
# Run on a Debian/Ubuntu machine with apt sources configured.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="${root}/.gpu-debs"
packages=(googletest libgtest-dev libgmock-dev)

mkdir -p "${dest}"
cd "${dest}"
rm -f ./*.deb SHA256SUMS
apt-get download "${packages[@]}"
sha256sum ./*.deb > SHA256SUMS
echo "fetched into ${dest}:"
ls -l ./*.deb
