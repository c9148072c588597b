#!/usr/bin/env python3
"""A fixed small Llama trained under a few layouts on 2 and 4 MPI ranks:
tokens/s and seconds per step spent in communication (rank 0's time inside
collectives and point-to-point calls), for checking the tuner's cost model.

    python3 benchmarks/multi_rank_layouts.py [--build build] [--steps 12]

Runs `mpirun --oversubscribe` (as root it sets OMPI_ALLOW_RUN_AS_ROOT*). On a
machine with fewer cores than ranks, ranks share cores and the numbers show
the oversubscription, not the layout: state the core count beside them.
"""
import argparse, json, os, subprocess, sys, tempfile

LAYOUTS = [
    (1, "tp1-pp1-dp1-mb2"),
    (2, "tp2-pp1-dp1-mb2"),
    (2, "tp2-pp1-dp1-mb2-sp"),
    (2, "tp1-pp2-dp1-mb1"),
    (2, "tp1-pp1-dp2-mb2"),
    (2, "tp1-pp1-dp2-mb2-zero1"),
    (4, "tp2-pp2-dp1-mb1"),
    (4, "tp2-pp1-dp2-mb2"),
    (4, "tp1-pp2-dp2-mb1"),
    (4, "tp1-pp1-dp4-mb2"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    weft = os.path.abspath(os.path.join(a.build, "weft"))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_WAIT_POLICY="passive")
    print(f"model: small preset (6 layers, C=512), seq 256, global batch 8, fp32, "
          f"1 thread per rank, {os.cpu_count()} cores")
    print(f"{'ranks':>5}  {'layout':<26}{'tokens/s':>10}{'step (s)':>10}{'comm/step (s)':>15}")
    with tempfile.TemporaryDirectory() as tmp:
        for np_, layout in LAYOUTS:
            out = os.path.join(tmp, layout)
            cmd = [weft, "train", "--model", "small", "--seq", "256", "--global-batch", "8",
                   "--steps", str(a.steps), "--log-every", str(a.steps // 2), "--threads", "1",
                   "--eval-samples", "8", "--layout", layout, "--out", out]
            if np_ > 1:
                cmd = ["mpirun", "--oversubscribe", "-np", str(np_)] + cmd
            subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
            rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
            last = rows[-1]  # the window after warm-up
            print(f"{np_:>5}  {layout:<26}{last['tokens_per_s']:>10.0f}{last['step_s']:>10.3f}"
                  f"{last.get('comm_s', 0.0):>15.3f}")


if __name__ == "__main__":
    sys.exit(main())
