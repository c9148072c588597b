#!/usr/bin/env bash
# The MoE dry-runs of the issue's target, as a user runs them, on 2 cores:
# Mixtral 8x7B, Qwen3-30B-A3B and Llama 4 Scout on 64 H100, each searched
# (the default) RUNS times; prints each run's wall time, the median, the
# peak memory, the search's own line and the best layout. Target: every
# whole process under 1 s.
#   benchmarks/moe_dry_run_time.sh [path/to/weft] [runs]
set -euo pipefail
weft=${1:-build/weft}
runs=${2:-5}
pin=()
if command -v taskset >/dev/null && [ "$(nproc)" -gt 2 ]; then pin=(taskset -c 0,1); fi
while read -r model seq gbs; do
  walls=()
  out=$(mktemp)
  for ((i = 0; i < runs; ++i)); do
    OMP_NUM_THREADS=2 /usr/bin/time -f "%e %M" "${pin[@]}" "$weft" tune --dry-run --gpu h100 --gpus 64 \
      --model "$model" --seq "$seq" --global-batch "$gbs" --top 3 >"$out" 2>"$out.time"
    read -r wall rss < <(tail -1 "$out.time")
    walls+=("$wall")
  done
  median=$(printf '%s\n' "${walls[@]}" | sort -g | sed -n "$(((runs + 1) / 2))p")
  echo "$model (64 x h100, T $seq, GBS $gbs): wall ${walls[*]} s, median $median s, max RSS $((rss / 1024)) MiB"
  sed -n 's/^searched /  searched /p' "$out" | sed 's/; the rest.*//'
  sed -n '/^rank  layout/{n;p}' "$out" | awk '{print "  best: " $2}'
  rm -f "$out" "$out.time"
done <<'MODELS'
mixtral-8x7b 4096 256
qwen3-30b-a3b 4096 4096
llama4-scout 8192 1024
MODELS
