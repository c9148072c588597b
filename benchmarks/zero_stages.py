#!/usr/bin/env python3
"""ZeRO stages side by side: the small Llama trained on 4 CPU ranks as
tp1-pp1-dp4 under ZeRO-0, 1, 2 and 3: memory per rank (the arena's peak by
category, which the tests hold equal to the memory model) and seconds per step.

    python3 benchmarks/zero_stages.py [--build build] [--steps 12] [--ranks 4]

On a machine with fewer cores than ranks the step times show the
oversubscription: state the core count beside them.
"""
import argparse, json, os, subprocess, sys, tempfile

MiB = 1 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--ranks", type=int, default=4)
    a = ap.parse_args()
    weft = os.path.abspath(os.path.join(a.build, "weft"))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_WAIT_POLICY="passive", WEFT_DEVICE="cpu")
    print(f"model small (6 layers, C=512, 19.2M params), seq 256, global batch 16, fp32, {a.ranks} ranks of "
          f"1 thread, {os.cpu_count()} cores")
    cats = ["weights", "grads", "optimizer", "comm", "activations"]
    print(f"{'layout':<26}" + "".join(f"{c + ' MiB':>16}" for c in cats) + f"{'total MiB':>12}{'step (s)':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for zero in range(4):
            layout = f"tp1-pp1-dp{a.ranks}-mb2-zero{zero}"
            out = os.path.join(tmp, layout)
            subprocess.run(["mpirun", "--oversubscribe", "-np", str(a.ranks), weft, "train", "--model", "small",
                            "--seq", "256", "--global-batch", "16", "--steps", str(a.steps), "--log-every",
                            str(a.steps // 2), "--threads", "1", "--eval-samples", "8", "--layout", layout,
                            "--out", out, "--no-checkpoint"], check=True, env=env, stdout=subprocess.DEVNULL)
            rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
            ranks = [json.load(open(os.path.join(out, "memory", f))) for f in os.listdir(os.path.join(out, "memory"))]
            worst = max(ranks, key=lambda r: sum(r["measured"].values()))["measured"]
            print(f"{layout:<26}" + "".join(f"{worst[c] / MiB:>16.1f}" for c in cats) +
                  f"{sum(worst.values()) / MiB:>12.1f}{rows[-1]['step_s']:>10.3f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
