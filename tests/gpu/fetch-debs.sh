#!/usr/bin/env bash
# Downloads the Debian packages tests/gpu/run.sh needs on a GPU machine that
# has no network and no package manager access, into the git-ignored
# .gpu-debs/ at the repository root (carry it with the working tree):
#   googletest       GoogleTest sources (run.sh builds them with the GPU
#                    machine's compiler)
#   libgtest-dev     headers, static libraries, CMake config (prebuilt
#   libgmock-dev     fallback)
#   libabsl-dev      abseil headers and CMake config, and
#   libabsl20220623  its shared libraries: every test links abseil, and
#                    index/ (the GPU-against-CPU selection test) needs it
# About 2.3 MB. Run on a Debian 12 (bookworm) machine with apt sources:
# the package lists are refreshed first (apt-get update, as root or through
# sudo), so a fresh machine works.
#
# Exit status: 0 when every package was downloaded and checksummed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="${root}/.gpu-debs"
packages=(googletest libgtest-dev libgmock-dev libabsl-dev libabsl20220623)

command -v apt-get >/dev/null 2>&1 || { echo "fetch-debs.sh: apt-get not found (run on Debian)" >&2; exit 2; }
if [[ "$(id -u)" == 0 ]]; then
  apt-get update -qq
elif command -v sudo >/dev/null 2>&1; then
  sudo apt-get update -qq
else
  echo "fetch-debs.sh: not root and no sudo: using the package lists as they are" >&2
fi

mkdir -p "${dest}"
cd "${dest}"
rm -f ./*.deb SHA256SUMS
apt-get download "${packages[@]}"
sha256sum ./*.deb > SHA256SUMS
echo "fetched into ${dest}:"
ls -l ./*.deb
