#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks, then configures and builds weft
# into build/ (chromium is the headless browser the HTML report test renders
# pages with; zlib reads its screenshots). Safe to run again: it installs only missing packages and
# rebuilds incrementally. Extra arguments are passed to the CMake configure.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."

packages=(cmake g++ make ninja-build pkg-config
          libopenmpi-dev openmpi-bin libnlopt-dev libnlopt-cxx-dev libfmt-dev
          libcli11-dev nlohmann-json3-dev libopenblas-openmp-dev
          libgtest-dev libgmock-dev libbenchmark-dev fortunes procps
          libpcre2-dev libsentencepiece-dev
          libprotobuf-dev protobuf-compiler  # TensorBoard event files (report/tensorboard_event.proto)
          slurmctld slurmd slurm-client munge  # tests/slurm: a real Slurm cluster on this machine
          zlib1g-dev chromium
          clang libclang-rt-dev libomp-dev)  # tools/sanitize.sh and tools/fuzz.sh: clang, libFuzzer, OpenMP
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

# With a CUDA toolkit, the cuDNN frontend's C++ headers (a PyPI package) for
# the attn:cudnn kernels; CMake finds them in the Python purelib. Optional:
# without them the build still has every other kernel, so a failed install
# is reported and set-up goes on.
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then
  py=$(command -v python3 || true)
  if [ -z "$py" ]; then
    echo "setup: no python3, so no cuDNN frontend (attn:cudnn stays unavailable)"
  elif ! "$py" -m pip show -q nvidia-cudnn-frontend >/dev/null 2>&1; then
    echo "setup: installing nvidia-cudnn-frontend (cuDNN frontend headers, for attn:cudnn)"
    "$py" -m pip install -q --disable-pip-version-check nvidia-cudnn-frontend >/dev/null 2>&1 ||
      echo "setup: could not install nvidia-cudnn-frontend; building without attn:cudnn"
  fi
fi

# The tensorboard Python package: test_cli_tensorboard reads weft's event
# files back with it, as TensorBoard loads them.
if command -v python3 >/dev/null 2>&1 && ! python3 -c "import tensorboard" >/dev/null 2>&1; then
  echo "setup: installing tensorboard (Python; the TensorBoard test reads event files with it)"
  python3 -m pip install -q --disable-pip-version-check tensorboard >/dev/null 2>&1 ||
    echo "setup: could not install tensorboard; test_cli_tensorboard will fail until it is installed"
fi

jobs=${WEFT_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=${WEFT_BUILD_TYPE:-Release} "$@"
cmake --build build -j "$jobs"
