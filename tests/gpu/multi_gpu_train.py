#!/usr/bin/env python3
"""Training on several devices against one: the tiny model trains for a few
steps under layouts that spread it over 2 ranks (context parallelism with each
transport, tensor, pipeline and data parallelism with ZeRO, and FP8 GEMMs under
sequence and pipeline parallelism, whose kept FP8 inputs are gathered or held
per micro-batch), each started with `mpirun -np 2`, and every step's loss is
compared with the same run on one rank (with the same FP8 recipe).

    python3 tests/gpu/multi_gpu_train.py --weft build/weft [--device gpu|cpu] [--steps 20]

On GPUs (the default) the ranks talk over NCCL, one GPU each, and the rule is
the bf16 training tests' (tests/gpu/test_gpu_train.cpp): every step within
4/256 of the one-GPU loss and the mean within 1/256. Fewer than 2 GPUs: it
says so and exits 77 (skipped). With --device cpu the same runs go over MPI on
host memory in fp32, held to 1e-5 (the layout parity tests' rule): that is how
this script is itself checked on machines without GPUs. FP8 layouts (the
emulated FP8 on a CPU) take the layout parity tests' FP8 rule there, 3e-3:
splitting a sum moves a few values across an FP8 rounding boundary. FP8 on
GPUs needs compute capability 8.9 or newer; elsewhere those layouts fail.
"""
import argparse, json, os, shutil, subprocess, sys, tempfile

# Flash attention: the only CUDA attention that takes blocks of the sequence.
LAYOUTS = [
    "tp1-cp2-pp1-dp1-mb1-attn:flash-cp:ring",
    "tp1-cp2-pp1-dp1-mb1-attn:flash-cp:allgather",
    "tp1-cp2-pp1-dp1-mb1-attn:flash-cp:a2a",
    "tp1-cp2-pp1-dp1-mb1-attn:flash-ckpt:full-cp:ring",
    "tp2-pp1-dp1-mb1-sp-attn:flash",
    "tp1-pp2-dp1-mb1-attn:flash",
    "tp1-pp1-dp2-mb1-attn:flash-zero1",
    "tp1-pp1-dp2-mb1-attn:flash-zero3",
    "tp2-pp1-dp1-mb1-sp-attn:flash-fp8:tensorwise",
    "tp1-pp2-dp1-mb1-attn:flash-fp8:delayed",
]


def fp8_of(layout):
    """The layout's FP8 knob ("-fp8:..."), or "" without one."""
    at = layout.find("-fp8:")
    return layout[at:] if at >= 0 else ""


def gpu_count():
    if not shutil.which("nvidia-smi"):
        return 0
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU ")) if r.returncode == 0 else 0


def losses(path):
    rows = [json.loads(line) for line in open(path)]
    return {r["step"]: r["loss"] for r in rows if r.get("kind") == "train"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layouts", nargs="*", default=LAYOUTS)
    a = ap.parse_args()
    if a.device == "gpu" and gpu_count() < 2:
        print(f"multi_gpu_train: {gpu_count()} GPU(s) here, 2 needed; skipped")
        return 77
    weft = os.path.abspath(a.weft)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_WAIT_POLICY="passive", WEFT_DEVICE=a.device)
    per_step, mean_rule = (4 / 256, 1 / 256) if a.device == "gpu" else (1e-5, 1e-5)
    base = ["train", "--model", "tiny", "--seq", "256", "--global-batch", "4", "--steps", str(a.steps),
            "--warmup", "2", "--log-every", "1", "--eval-every", "0", "--threads", "1", "--no-checkpoint"]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        def train(ranks, layout):
            out = os.path.join(tmp, f"{ranks}-{layout}")
            cmd = [weft] + base + ["--layout", layout, "--out", out]
            if ranks > 1:
                cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] + cmd
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                sys.stdout.write(r.stdout[-2000:] + r.stderr[-2000:])
                return None
            return losses(os.path.join(out, "metrics.jsonl"))

        ones = {}
        for fp8 in sorted({fp8_of(layout) for layout in a.layouts}):
            ones[fp8] = train(1, "tp1-pp1-dp1-mb1-attn:flash" + fp8)
            if ones[fp8] is None or len(ones[fp8]) != a.steps:
                print(f"multi_gpu_train: the one-rank run{' with ' + fp8[1:] if fp8 else ''} failed")
                return 1
        print(f"device {a.device}; rule: every step within {per_step:.3g}, the mean within {mean_rule:.3g} "
              f"(relative, against one rank{'; FP8 layouts 3e-3' if a.device == 'cpu' else ''})")
        print(f"{'layout (2 ranks)':<48}{'worst':>10}{'mean':>10}  result")
        for layout in a.layouts:
            one = ones[fp8_of(layout)]
            worst_rule, mean_rule_here = (per_step, mean_rule) if a.device == "gpu" or not fp8_of(layout) else (3e-3, 3e-3)
            two = train(2, layout)
            if two is None or sorted(two) != sorted(one):
                print(f"{layout:<48}{'':>20}  FAILED (the run failed or logged other steps)")
                failed += 1
                continue
            rel = [abs(two[s] - one[s]) / abs(one[s]) for s in sorted(one)]
            worst, mean = max(rel), sum(rel) / len(rel)
            ok = worst <= worst_rule and mean <= mean_rule_here
            failed += not ok
            print(f"{layout:<48}{worst:>10.2e}{mean:>10.2e}  {'ok' if ok else 'FAILED'}")
    print(f"multi_gpu_train: {len(a.layouts) - failed} of {len(a.layouts)} layouts within the rule")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
