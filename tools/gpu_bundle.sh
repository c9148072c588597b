#!/usr/bin/env bash
# Packs weft's GPU test and benchmark programs, with the shared libraries they
# need that a bare CUDA machine lacks (OpenBLAS, fmt, nlopt, Open MPI and
# their own dependencies), into one compressed archive. It is for a GPU
# machine that has the NVIDIA driver, the CUDA runtime and cuBLAS (and, for
# attn:cudnn and multi-GPU runs, cuDNN 9 and NCCL, e.g. from their PyPI
# wheels) but none of weft's build dependencies: unpack it there and run
# tools/gpu_checks.sh.
#
#   tools/gpu_bundle.sh [build-dir] [archive]     (defaults: build, gpu-bundle.tar.xz)
#
# The programs keep their names and relative paths under the build folder;
# libraries go to lib/. CUDA's own libraries are left out on purpose: they
# must match the machine's driver.
#
# Open MPI's runtime travels too, under ompi/ with its installed paths (mpirun,
# its components, PMIx and their help texts), so that the multi-rank checks
# can start ranks on a machine that has no MPI: tools/gpu_checks.sh points
# OPAL_PREFIX and PMIX_INSTALL_PREFIX at it when the machine has no mpirun of
# its own. The programs are linked against this Open MPI, so its own mpirun is
# the one that matches them.
set -euo pipefail
build=${1:-build}
archive=${2:-gpu-bundle.tar.xz}
programs=(weft tests/gpu/test_gpu_kernels tests/gpu/test_gpu_attention tests/gpu/test_gpu_train
          tests/unit/test_gpu_workspace tests/mpi/test_comm_device
          benchmarks/bench_gpu_kernels benchmarks/bench_gpu_attention)
# Built only with the cuDNN frontend.
[ -x "$build/tests/unit/test_cudnn_graphs" ] && programs+=(tests/unit/test_cudnn_graphs)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
# Every library the loader resolves for `$1` outside the CUDA toolkit, the C
# runtime and the kernel's vDSO, into lib/.
copy_libs() {
  { ldd "$1" 2>/dev/null || true; } | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) continue ;;
      libcuda.so*|libcudart.so*|libcublas*|libnvrtc*|libcudnn*|libnccl*|libnvJitLink*) continue ;;
    esac
    cp -nL "$lib" "$stage/lib/"
  done
}
for p in "${programs[@]}"; do
  if [ ! -x "$build/$p" ]; then
    echo "gpu_bundle: $build/$p is missing; build with CUDA first (tools/setup.sh or cmake --build $build)" >&2
    exit 2
  fi
  mkdir -p "$stage/$(dirname "$p")"
  cp "$build/$p" "$stage/$p"
  copy_libs "$build/$p"
done
if command -v dpkg-query > /dev/null && dpkg-query -W openmpi-bin libopenmpi3 libpmix2 > /dev/null 2>&1; then
  mkdir -p "$stage/ompi"
  dpkg-query -L openmpi-bin libopenmpi3 openmpi-common libpmix2 |
    grep -v -e '/share/doc' -e '/share/man' -e '/share/lintian' -e '/include/' | sort -u | while read -r f; do
      [ -f "$f" ] || [ -L "$f" ] || continue
      mkdir -p "$stage/ompi$(dirname "$f")"
      cp -P "$f" "$stage/ompi$f"
    done
  ln -sf orterun "$stage/ompi/usr/bin/mpirun"
  # The components' own libraries (hwloc, libevent, fabric, ucx, ...).
  find "$stage/ompi" -type f \( -name '*.so*' -o -path '*/bin/*' \) | while read -r f; do copy_libs "$f"; done
else
  echo "gpu_bundle: Open MPI's Debian packages are not installed here; the bundle carries no mpirun" >&2
fi
tar -C "$stage" -cJf "$archive" .
echo "gpu_bundle: $archive ($(du -h "$archive" | cut -f1)): ${#programs[@]} programs, $(ls "$stage/lib" | wc -l) libraries"
