#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, ASan + UBSan, CPU only)
# into build-san/, the build tools/sanitize.sh makes, and runs each for a
# bounded time over a copy of its seed corpus. Exits non-zero when any target
# reports a finding (a crash, a sanitizer report, an exception other than
# weft::InputError, a leak or a timeout); the input that caused it is left in
# build-san/fuzz/<target>/ as crash-*, leak-*, timeout-* or oom-*.
#
#   tools/fuzz.sh                          # every target, 30 s each
#   WEFT_FUZZ_SECONDS=600 tools/fuzz.sh fuzz_recipe fuzz_journal
#   tools/fuzz.sh --list
#   WEFT_FUZZ_BUILD=0 tools/fuzz.sh   # run the targets as built, no build step
# New inputs that reach new code stay in build-san/fuzz/<target>/corpus;
# a regression input belongs in tests/fuzz/corpus/<name>/.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${WEFT_SAN_BUILD:-build-san}
seconds=${WEFT_FUZZ_SECONDS:-30}
jobs=${WEFT_JOBS:-$(nproc)}

all=$(cd tests/fuzz && ls fuzz_*.cpp | sed 's/\.cpp$//')
if [ "${1:-}" = "--list" ]; then echo "$all"; exit 0; fi
targets=${*:-$all}

if [ "${WEFT_FUZZ_BUILD:-1}" != 0 ]; then  # 0: run the targets as built
  if [ ! -f "$build/CMakeCache.txt" ] || ! grep -q "WEFT_FUZZ:BOOL=ON" "$build/CMakeCache.txt"; then
    tools/sanitize.sh --configure-only
  fi
  # shellcheck disable=SC2086
  cmake --build "$build" -j "$jobs" --target $targets
fi

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
failed=()
for t in $targets; do
  name=${t#fuzz_}
  work="$root/$build/fuzz/$t"
  mkdir -p "$work/corpus"
  cp -n tests/fuzz/corpus/"$name"/* "$work/corpus/" 2>/dev/null || true
  echo "fuzz: $t for ${seconds}s"
  start=$(date +%s)
  # -rss_limit_mb: ASan's shadow memory and the fuzzer's corpus fit well
  # under 2 GiB; an input that makes a parser allocate more is a finding.
  if (cd "$work" && TMPDIR="$work" "$root/$build/tests/fuzz/$t" -max_total_time="$seconds" \
        -rss_limit_mb=2048 -timeout=25 -print_final_stats=1 -artifact_prefix="$work/" \
        corpus >"$work/log.txt" 2>&1); then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/log.txt" | grep -o '[0-9]*$' || echo "?")
    echo "fuzz: $t ok: $runs runs in $(( $(date +%s) - start ))s, corpus $(ls "$work/corpus" | wc -l) inputs"
  else
    echo "fuzz: $t FAILED (log $work/log.txt):"
    grep -E "ERROR|finding|SUMMARY|Test unit written" "$work/log.txt" | head -20
    failed+=("$t")
  fi
  rm -rf "$work"/weft-fuzz.*
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]}"
  exit 1
fi
echo "fuzz: no findings"
