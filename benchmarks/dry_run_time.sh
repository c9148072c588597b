#!/usr/bin/env bash
# The dry-run's wall time and peak memory as a user runs it, on 2 cores:
# Llama 3.1 405B on 16384 H100s at 8k tokens with every knob free, searched
# (the default) and evaluated layout by layout (--exhaustive), under
# /usr/bin/time -v. Target: the search under 1 s and 1 GiB.
#   benchmarks/dry_run_time.sh [path/to/weft] [extra weft tune options]
set -euo pipefail
weft=${1:-build/weft}
shift || true
cmd=(tune --dry-run --model llama3.1-405b --gpu h100 --gpus 16384 --seq 8192 "$@")
pin=()
if command -v taskset >/dev/null && [ "$(nproc)" -gt 2 ]; then pin=(taskset -c 0,1); fi
for mode in search exhaustive; do
  extra=()
  [ "$mode" = exhaustive ] && extra=(--exhaustive)
  out=$(mktemp)
  OMP_NUM_THREADS=2 /usr/bin/time -v "${pin[@]}" "$weft" "${cmd[@]}" "${extra[@]}" >"$out" 2>"$out.time"
  wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$out.time")
  rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$out.time")
  echo "$mode: wall $wall, max RSS $((rss / 1024)) MiB"
  sed -n 's/^\(searched\|evaluated\) /  \1 /p' "$out"
  sed -n '/^rank  layout/{n;p}' "$out" | sed 's/^/  best: /'
  rm -f "$out" "$out.time"
done
