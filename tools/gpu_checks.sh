#!/usr/bin/env bash
# Every GPU check of weft in one go, from a build folder or from an archive
# made by tools/gpu_bundle.sh, writing each step's output to a log folder:
#
#   tools/gpu_checks.sh [--bundle gpu-bundle.tar.xz | --build build] [--out dir] [steps...]
#
# Steps (default: all, in this order; each program runs under a limit just
# under 10 minutes, so a step can also be run on its own where a session's
# commands are time-limited):
#   tests      the gpu-labelled tests (kernels with the fp8 ops, attention, training,
#              workspace)
#   sanitize   compute-sanitizer memcheck over the kernel, attention and training tests
#   kernels    bench_gpu_kernels: each family against the measured copy and GEMM ceilings,
#              gemm beside cuBLAS's best; benchmarks/kernels_vs_pytorch.py: rmsnorm and
#              cross-entropy beside PyTorch eager
#   gemm-tune  the GEMMs with WEFT_GEMM_TUNE=1 (each plan times cuBLASLt's candidates
#              and keeps the fastest): the GEMM tests, bench_gpu_kernels' gemm rows
#              (pct_of_cublas_best, target 95) and mfu_vs_pytorch at micro-batch 1
#   attention  bench_gpu_attention and benchmarks/attention_vs_pytorch.py
#   mfu        benchmarks/mfu_vs_pytorch.py (Llama 3.2 1B, weft vs PyTorch): the
#              steps mfu1, mfu2 and mfu4, one micro-batch size each (4 a step);
#              mfu8 runs micro-batch 8, one a step, with bf16-gradient rows too
#   auto       weft train --auto on Llama 3.2 1B (T 2048, 8 sequences a step, random
#              tokens): the trials, the winner and the cost model's error, then
#              200 steps of training
#   memory     benchmarks/gpu_memory_model.py (the memory model against the
#              device): memory-flash, memory-materialized and memory-cudnn
#   probe      what the multi-rank checks stand on: mpirun starting 2 ranks
#              (a CPU run of weft train over MPI), and test_comm_device over
#              NCCL with as many ranks as there are GPUs (one rank: every
#              NCCL call once, on a communicator of one)
#   multi      several ranks on the GPUs there are, sharing them where there
#              are fewer GPUs than ranks: test_comm_device over the MPI device
#              communicator (2 and 4 ranks) and over NCCL (2 ranks, with 2
#              GPUs), then tests/gpu/multi_gpu_train.py, every multi-rank
#              layout against one rank, with memcheck on a 2-rank layout of
#              each collective pattern; its table goes to multi.md
# A whole step may take longer than 10 minutes; each of its parts fits.
# To fit a short lease: WEFT_GPU_SANITIZE_FILTER (a GoogleTest filter) narrows
# the sanitize step to those tests, and WEFT_GPU_BENCH_FILTER (a Google
# Benchmark regex) the kernels step to those rows, without the PyTorch side.
# Needs the NVIDIA driver and the CUDA runtime; cuDNN and NCCL are found in
# the CUDA folder or in Python's nvidia-* wheels, when present.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bundle="" build="$here/build" out="gpu-checks"
steps=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    tests|sanitize|kernels|gemm-tune|attention|auto|mfu[1248]|memory-flash|memory-materialized|memory-cudnn|probe|multi) steps+=("$1"); shift ;;
    mfu) steps+=(mfu1 mfu2 mfu4); shift ;;
    memory) steps+=(memory-flash memory-materialized memory-cudnn); shift ;;
    *) echo "gpu_checks: '$1' is not an option or step; see the top of $0" >&2; exit 2 ;;
  esac
done
[ ${#steps[@]} -eq 0 ] && steps=(tests sanitize kernels gemm-tune attention auto mfu1 mfu2 mfu4 mfu8 memory-flash memory-materialized
                                 memory-cudnn probe multi)
mkdir -p "$out"
out=$(cd "$out" && pwd)

if [ -n "$bundle" ]; then
  build=$(mktemp -d)
  tar -C "$build" -xJf "$bundle" || { echo "gpu_checks: cannot unpack $bundle" >&2; exit 2; }
  export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# CUDA's libraries: the toolkit's, then those of the nvidia-* Python wheels.
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
wheel_libs=$(python3 - <<'EOF' 2>/dev/null
import importlib, os
dirs = []
for name in ("nvidia.cudnn", "nvidia.nccl", "nvidia.cublas", "nvidia.cuda_nvrtc", "nvidia.cuda_runtime"):
    try:
        m = importlib.import_module(name)
    except ImportError:
        continue
    for p in getattr(m, "__path__", []):
        if os.path.isdir(os.path.join(p, "lib")):
            dirs.append(os.path.join(p, "lib"))
print(":".join(dirs))
EOF
)
[ -n "$wheel_libs" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$wheel_libs"
# The bundle's own Open MPI (tools/gpu_bundle.sh), its installed paths moved
# under the bundle: the programs are linked against it, so its mpirun is
# taken over any the machine has.
if [ -x "$build/ompi/usr/bin/orterun" ]; then
  ompi=$build/ompi/usr
  export OPAL_PREFIX=$ompi OPAL_SYSCONFDIR=$build/ompi/etc/openmpi
  export PMIX_INSTALL_PREFIX=$ompi/lib/x86_64-linux-gnu/pmix2
  export PATH="$ompi/bin:$PATH" LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$ompi/lib/x86_64-linux-gnu/openmpi/lib"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The bundle's PMIx lacks its zlib component on some machines; that costs
# nothing at these sizes, so its page-long warning is silenced.
export PMIX_MCA_pcompress_base_silence_warning=1
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv,noheader > "$out/gpu.txt" 2>&1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
echo "gpu_checks: $(cat "$out/gpu.txt"); programs from $build; logs in $out"

status=0
run() {  # run <step> <seconds> <command...>: one step, its output in <step>.log
  local step=$1 limit=$2
  shift 2
  echo "== $step: $*" | tee -a "$out/$step.log"
  timeout "$limit" "$@" >> "$out/$step.log" 2>&1
  local rc=$?
  echo "== $step: exit $rc$([ $rc -eq 77 ] && echo ' (skipped)')" | tee -a "$out/$step.log"
  [ $rc -ne 0 ] && [ $rc -ne 77 ] && status=1
  return 0
}

for s in "${steps[@]}"; do
  case "$s" in
    tests)
      # test_cudnn_graphs again here: the machine's cuDNN may not be the build's.
      for t in tests/unit/test_gpu_workspace tests/unit/test_cudnn_graphs tests/gpu/test_gpu_kernels \
               tests/gpu/test_gpu_attention tests/gpu/test_gpu_train; do
        if [ -x "$build/$t" ]; then run tests 590 "$build/$t"; fi
      done ;;
    sanitize)
      # The protocol tests that provoke a CUDA error on purpose (a bad device
      # ordinal, an allocation too large) are left out: memcheck counts those.
      only=${WEFT_GPU_SANITIZE_FILTER:-*}
      run sanitize 590 compute-sanitizer --tool memcheck --error-exitcode 1 "$build/tests/gpu/test_gpu_kernels" \
        "--gtest_filter=$only-GpuProtocol.CudaCheckNamesTheCall:GpuProtocol.DeviceArena"
      for t in tests/gpu/test_gpu_attention tests/gpu/test_gpu_train; do
        run sanitize 590 compute-sanitizer --tool memcheck --error-exitcode 1 "$build/$t" "--gtest_filter=$only"
      done ;;
    kernels)
      if [ -n "${WEFT_GPU_BENCH_FILTER:-}" ]; then
        run kernels 590 "$build/benchmarks/bench_gpu_kernels" "--benchmark_filter=$WEFT_GPU_BENCH_FILTER"
      else
        run kernels 590 "$build/benchmarks/bench_gpu_kernels"
        run kernels 590 python3 "$here/benchmarks/kernels_vs_pytorch.py" --build "$build"
      fi ;;
    gemm-tune)
      run gemm-tune 590 env WEFT_GEMM_TUNE=1 "$build/tests/gpu/test_gpu_kernels" \
        "--gtest_filter=GpuGemm*:GpuGroupedGemm*"
      run gemm-tune 590 env WEFT_GEMM_TUNE=1 "$build/benchmarks/bench_gpu_kernels" "--benchmark_filter=gemm"
      run gemm-tune 590 env WEFT_GEMM_TUNE=1 python3 "$here/benchmarks/mfu_vs_pytorch.py" --weft "$build/weft" \
        --mb-list 1 ;;
    attention)
      run attention 590 "$build/benchmarks/bench_gpu_attention"
      run attention 590 python3 "$here/benchmarks/attention_vs_pytorch.py" --build "$build" ;;
    mfu[124]) run "$s" 590 python3 "$here/benchmarks/mfu_vs_pytorch.py" --weft "$build/weft" --mb-list "${s#mfu}" ;;
    mfu8) run "$s" 590 python3 "$here/benchmarks/mfu_vs_pytorch.py" --weft "$build/weft" --mb-list 8 --accum 1 \
            --grads fp32,bf16 ;;
    auto)
      tokens="$out/auto-tokens.npy"
      python3 -c "import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng(7).integers(0, 128256, size=1 << 22, dtype=np.int32))" "$tokens"
      run auto 590 "$build/weft" train --model llama3.2-1b --data "$tokens" --seq 2048 --global-batch 8 --steps 200 \
        --tune-top 10 --eval-every 0 --eval-samples 8 --no-checkpoint --log-every 20 --out "$out/auto-run" --overwrite
      rm -f "$tokens" ;;
    memory-*)
      run "$s" 590 python3 "$here/benchmarks/gpu_memory_model.py" --weft "$build/weft" --attn "${s#memory-}" ;;
    probe)
      tokens="$out/probe-tokens.npy"
      python3 -c "import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng(3).integers(0, 256, size=1 << 16, dtype=np.int32))" "$tokens"
      run probe 120 mpirun --version
      run probe 300 mpirun --oversubscribe -np 2 "$build/weft" train --device cpu --model tiny --seq 64 \
        --global-batch 4 --steps 3 --layout tp1-pp1-dp2-mb1 --eval-every 0 --no-checkpoint --threads 1 \
        --log-every 1 --data "$tokens" --out "$out/probe-run" --overwrite
      run probe 300 mpirun --oversubscribe -np "$gpus" "$build/tests/mpi/test_comm_device" --comm nccl ;;
    multi)
      for np in 2 4; do
        run multi 300 mpirun --oversubscribe -np $np "$build/tests/mpi/test_comm_device" --comm mpi
      done
      [ "$gpus" -ge 2 ] && run multi 300 mpirun --oversubscribe -np 2 "$build/tests/mpi/test_comm_device" --comm nccl
      # Tokens of its own: a bare GPU machine lacks the fortunes text of weft's built-in corpus.
      tokens="$out/multi-tokens.npy"
      python3 -c "import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng(5).integers(0, 256, size=1 << 18, dtype=np.int32))" "$tokens"
      run multi 590 python3 "$here/tests/gpu/multi_gpu_train.py" --weft "$build/weft" --data "$tokens" --jobs 8 \
        --memcheck --summary "$out/multi.md"
      rm -f "$tokens" ;;
  esac
done
echo "gpu_checks: done (exit $status); logs in $out"
exit $status
