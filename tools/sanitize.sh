#!/usr/bin/env bash
# Builds weft with AddressSanitizer and UndefinedBehaviorSanitizer (clang,
# CPU only) into build-san/ and runs the unit and e2e tests under them. Any
# sanitizer report fails the run: UBSan is built with -fno-sanitize-recover,
# ASan and LeakSanitizer exit non-zero on their own.
#
# The same build holds the fuzz targets (tools/fuzz.sh): the libraries that
# parse user input are also compiled with -fsanitize=fuzzer-no-link, whose
# coverage counters cost the tests little, so CI compiles weft once for both
# instead of twice.
#
#   tools/sanitize.sh              # build, then ctest -L 'unit|e2e|mpi' but the slowest mpi tests
#   WEFT_SAN_SKIP= tools/sanitize.sh           # every test of those labels (6 more minutes)
#   WEFT_SAN_GTEST_SKIP= tools/sanitize.sh     # and the four scale cases left out (below)
#   WEFT_SAN_LABELS=unit tools/sanitize.sh     # other labels
#   tools/sanitize.sh --build-only      (or --configure-only)
# Extra ctest arguments may follow, e.g. tools/sanitize.sh -R test_core.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${WEFT_SAN_BUILD:-build-san}
jobs=${WEFT_JOBS:-$(nproc)}

# The slowest mpi tests take about 6 minutes under ASan on 2 cores (layout
# parity alone 4; the MoE parity's layouts run the MoE block that
# test_moe_stage runs sanitized on one rank), and the 20 kill trials are
# about timing, not memory; CI
# skips them, and the multi-GPU check's CPU run, whose cp, tp, pp and dp
# paths the mpi tests above already run under the sanitizers (it starts
# mpirun itself, so it would need the slow unwinder too). WEFT_SAN_SKIP=
# runs them too. test_cli_tune (3 minutes sanitized) is skipped too while CI
# is near its time limit: the tuner's unit tests (test_tuner, test_tune) and
# test_cli_outputs run its search, tuning and listings sanitized.
skip=${WEFT_SAN_SKIP-'^(test_layout_parity|test_pipeline_split|test_hybrid_sharding|test_moe_parity|test_init_mpi|test_tune_mpi|test_kill_ranks|test_multi_gpu_train_script|test_cli_tune)$'}
# Nor are they built (WEFT_TESTS_NOT_BUILT), which saves minutes of the build.
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja \
  -DCMAKE_CXX_COMPILER="${WEFT_SAN_CXX:-clang++}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DWEFT_CUDA=OFF -DWEFT_SANITIZE=ON -DWEFT_FUZZ=ON \
  -DWEFT_TESTS=ON -DWEFT_BENCHMARKS=OFF -DWEFT_TESTS_NOT_BUILT="$skip" >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
grep "weft feature" "$build/configure.log" || true
[ "${1:-}" = "--configure-only" ] && exit 0

cmake --build "$build" -j "$jobs"
[ "${1:-}" = "--build-only" ] && exit 0

# OpenMPI and hwloc keep allocations for the life of the process that they
# never free (MPI_Init's registries, hwloc's topology); the suppressions name
# only those libraries, so a leak in weft's own code still fails the run.
export LSAN_OPTIONS="suppressions=$root/tools/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ "${1:-}" = "--" ] && shift
# Tests that run weft under mpirun. OpenMPI's libraries have no frame
# pointers, so the fast unwinder stops in them and their leaks read "<unknown
# module>", which no suppression names; these tests get the full unwinder
# (fast_unwind_on_malloc=0), which names the library but makes every malloc
# slow (test_cli_tune ran past its 300 s limit with it), so only they do.
mpirun_tests='^(test_cli_calibrate|test_mpi_.*|.*_mpi|test_layout_parity|test_pipeline_split|test_hybrid_sharding|test_moe_parity|test_context_parallel.*|test_multi_gpu_train_script)$'
labels=${WEFT_SAN_LABELS:-unit|e2e|mpi}
skip_args=()
[ -n "$skip" ] && skip_args=(-E "$skip")
# Four test cases run, at scale, code that smaller sanitized cases beside
# them run too, and take 10 of the stage's CPU minutes under ASan: the 65B
# dry-run page on 1,024 GPUs, written (CliReport) and drawn in Chromium
# (ReportBrowser; the browser is not under test here), where
# CliReport.LargeDryRunKeepsTheFrontExact writes a binned page of over 4,000
# layouts; the search against the exhaustive listing (a check of the bounds'
# logic; the other SpaceSearch cases run the search); and every layout of a
# 7B space in three formats (CliTune.MachineFormatsListEveryLayout
# writes them). CI leaves them out here; the main ctest runs them all.
# SpaceSearch.LoraFitsWhereFullFineTuningDoesNot searches a 70B space on 8
# and 16 GPUs and evaluates the whole first one (70 s under ASan), and
# SpaceSearch.BoundsNeverExceedTheLayouts holds the step bounds of thousands
# of subspaces against their layouts (arithmetic, 60 s under ASan): code the
# smaller SpaceSearch and Space cases run sanitized.
# CliListings.LargeSpacesStayInBoundedMemory holds weft to a 2 GiB address
# space, which ASan's shadow memory alone exceeds, over spaces of millions of
# layouts; the smaller scan cases (SpaceScan) run here.
# SpaceExperts.EpIsSearchedWhereItDividesAndPrunedWithItsRule checks every
# layout of Mixtral's space on 64 H100s, millions (90 s under ASan), which
# the smaller SpaceExperts cases enumerate too; and
# CliAsyncSave.AKillDuringAWriteLeavesTheLastCompleteCheckpoint kills runs
# at set moments, about timing like the kill trials (its sibling runs the
# asynchronous save sanitized).
# WEFT_SAN_GTEST_SKIP= runs them too.
gtest_skip=${WEFT_SAN_GTEST_SKIP-'CliReport.LargestDryRunStaysSmall:ReportBrowser.DryRunPages:SpaceSearch.ListsTheExhaustiveRows:CliTune.MachineFormatsListEveryLayout:CliListings.LargeSpacesStayInBoundedMemory:SpaceSearch.LoraFitsWhereFullFineTuningDoesNot:SpaceSearch.BoundsNeverExceedTheLayouts:SpaceExperts.EpIsSearchedWhereItDividesAndPrunedWithItsRule:CliAsyncSave.AKillDuringAWriteLeavesTheLastCompleteCheckpoint'}
if [ -n "$gtest_skip" ]; then
  case "${GTEST_FILTER:-*}" in
    *-*) export GTEST_FILTER="$GTEST_FILTER:$gtest_skip" ;;  # negative patterns already
    *) export GTEST_FILTER="${GTEST_FILTER:-*}-$gtest_skip" ;;
  esac
fi
status=0
ctest --test-dir "$build" --output-on-failure -j "${WEFT_SAN_CTEST_JOBS:-2}" \
  -L "$labels" -E "$mpirun_tests${skip:+|$skip}" "$@" || status=1
LSAN_OPTIONS="$LSAN_OPTIONS:fast_unwind_on_malloc=0" \
  ctest --test-dir "$build" --output-on-failure -L "$labels" -R "$mpirun_tests" "${skip_args[@]}" "$@" || status=1
exit $status
