#!/usr/bin/env python3
"""Long context on the CPU: the tiny Llama at T = 8192 under a per-rank
memory limit. One rank (cp 1) needs more than the limit, so weft refuses the
layout before allocating anything; four ranks splitting each sequence
(cp 4, ring and all-gather) fit under it and train to the same losses. For
each run: the memory model's and the arena's peak on the worst rank, the
kernel's count of the rank's resident growth, seconds per step and the losses.

    python3 benchmarks/long_context_cpu.py [--build build] [--limit 200MiB] [--seq 8192] [--steps 2]

On a machine with fewer cores than ranks the step times show the
oversubscription: state the core count beside them.
"""
import argparse, json, os, subprocess, sys, tempfile

MiB = 1 << 20


def run(weft, env, tmp, layout, ranks, a, limit):
    out = os.path.join(tmp, layout.replace(":", "_") + ("-limited" if limit else ""))
    cmd = [weft, "train", "--model", "tiny", "--seq", str(a.seq), "--global-batch", "4", "--steps", str(a.steps),
           "--log-every", "1", "--threads", "1", "--eval-samples", "1", "--layout", layout, "--out", out,
           "--no-checkpoint"]
    if limit:
        cmd += ["--memory-limit", a.limit]
    if ranks > 1:
        cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] + cmd
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        reason = next((l for l in (p.stderr + p.stdout).splitlines() if "error" in l), "").strip()
        return {"code": p.returncode, "reason": reason}
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"kind":"train"' in l]
    mem = [json.load(open(os.path.join(out, "memory", f))) for f in os.listdir(os.path.join(out, "memory"))]
    worst = max(mem, key=lambda r: sum(r["measured"].values()))
    return {"code": 0, "predicted": sum(worst["predicted"].values()), "measured": sum(worst["measured"].values()),
            "independent": max(r.get("independent", {}).get("bytes", 0) for r in mem),
            "step_s": rows[-1]["step_s"], "losses": [r["loss"] for r in rows]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--limit", default="200MiB")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args()
    weft = os.path.abspath(os.path.join(a.build, "weft"))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_WAIT_POLICY="passive", WEFT_DEVICE="cpu")
    print(f"tiny (4 layers, C=128, 0.8M params), seq {a.seq}, global batch 4, mb 1, fp32, attn flash, "
          f"1 thread per rank, {os.cpu_count()} cores; limit per rank {a.limit}")
    print(f"{'layout':<40}{'ranks':>6}{'limit':>7}{'model MiB':>11}{'arena MiB':>11}{'RSS+ MiB':>10}"
          f"{'step (s)':>10}  losses / refusal")
    runs = [("tp1-pp1-dp1-mb1", 1, False), ("tp1-pp1-dp1-mb1", 1, True),
            ("tp1-cp4-pp1-dp1-mb1-cp:ring", 4, True), ("tp1-cp4-pp1-dp1-mb1-cp:allgather", 4, True)]
    reference = None
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for layout, ranks, limit in runs:
            r = run(weft, env, tmp, layout, ranks, a, limit)
            lim = "yes" if limit else "no"
            if r["code"] != 0:
                print(f"{layout:<40}{ranks:>6}{lim:>7}{'':>11}{'':>11}{'':>10}{'':>10}  exit {r['code']}: "
                      f"{r['reason'][:120]}", flush=True)
                continue
            reference = reference or r["losses"]
            same = max(abs(x - y) / abs(y) for x, y in zip(r["losses"], reference))
            ok = ok and same <= 1e-5
            print(f"{layout:<40}{ranks:>6}{lim:>7}{r['predicted'] / MiB:>11.1f}{r['measured'] / MiB:>11.1f}"
                  f"{r['independent'] / MiB:>10.1f}{r['step_s']:>10.2f}  "
                  + " ".join(f"{x:.6f}" for x in r["losses"]) + f" (max rel dev {same:.1e})", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
