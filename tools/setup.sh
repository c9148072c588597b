#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks, then configures and builds weft
# into build/. Safe to run again: it installs only missing packages and
# rebuilds incrementally. Extra arguments are passed to the CMake configure.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake g++ make ninja-build pkg-config
          libopenmpi-dev openmpi-bin libnlopt-dev libnlopt-cxx-dev libfmt-dev
          libcli11-dev nlohmann-json3-dev libopenblas-openmp-dev
          libgtest-dev libgmock-dev libbenchmark-dev fortunes procps)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

jobs=${WEFT_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=${WEFT_BUILD_TYPE:-Release} "$@"
cmake --build build -j "$jobs"
