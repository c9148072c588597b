#!/usr/bin/env bash
# The CPU trainer's speed with each of OpenBLAS's x86 kernel sets this CPU
# can run, beside weft's own choice (kernels/gemm/blas_core.h): the tiny
# preset, 30 steps of 16 x 256 tokens at mb 4, no checkpoint, median tokens/s
# of three runs each. "as loaded" is the set OpenBLAS picks by itself, which
# weft replaces where it is narrower than the CPU.
#   benchmarks/blas_cores.sh [path/to/weft] [steps]
set -euo pipefail
weft=$(realpath "${1:-build/weft}")
steps=${2:-30}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
grep -m1 "model name" /proc/cpuinfo | sed 's/.*: /cpu: /'
echo "cores: $(nproc)"
run() {  # run LABEL CORETYPE|-: prints the label, the set that ran, the median tokens/s
  local label=$1 core=$2 rates=() i line
  for i in 1 2 3; do
    rm -rf "$work/r"
    if [ "$core" = - ]; then
      line=$(cd "$work" && env -u OPENBLAS_CORETYPE "$weft" train --layout mb4 --steps "$steps" --no-checkpoint \
        --eval-every 0 --out r 2>&1 | grep -E "^finished|^GEMMs" | tr '\n' ' ')
    else
      line=$(cd "$work" && OPENBLAS_CORETYPE=$core "$weft" train --layout mb4 --steps "$steps" --no-checkpoint \
        --eval-every 0 --out r 2>&1 | grep -E "^finished|^GEMMs" | tr '\n' ' ')
    fi
    rates+=("$(sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p' <<<"$line")")
  done
  local ran=${core}
  [ "$core" = - ] && ran=$(sed -n 's/.*running its \([A-Za-z0-9_]*\) kernels.*/\1/p' <<<"$line")
  [ -z "$ran" ] && ran="(as loaded)"
  printf '%-22s %-14s %8s tok/s  (runs: %s)\n' "$label" "$ran" \
    "$(printf '%s\n' "${rates[@]}" | sort -n | sed -n 2p)" "${rates[*]}"
}
printf '%-22s %-14s %14s\n' "choice" "kernel set" "median"
run "weft (default)" -
run "OPENBLAS_CORETYPE" Prescott
flags=$(grep -m1 '^flags' /proc/cpuinfo)
if grep -qw avx2 <<<"$flags"; then run "OPENBLAS_CORETYPE" Haswell; fi
if grep -qw avx512f <<<"$flags"; then run "OPENBLAS_CORETYPE" SkylakeX; fi
if grep -qw avx512_bf16 <<<"$flags"; then run "OPENBLAS_CORETYPE" Cooperlake; fi
