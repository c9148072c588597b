#!/usr/bin/env python3
"""Tuner quality: the layout `weft train --auto` picks against brute force.

For a small model on 4 MPI ranks, profiles every candidate layout (brute
force: --tune-all) and runs the tuner with its defaults, both with
the same trial settings and a fresh recipe cache. Then re-measures both
winners side by side (alternating short training runs, median tokens/s) and
prints the winners, their tokens/s, the ratio and the profiling time each
spent. Targets: the tuner's choice within 5% of the brute-force best, using
at most 30% of the brute-force profiling time.

    python3 benchmarks/tuner_quality.py [--build build] [--model tiny] [--seq 64]
        [--global-batch 16] [--trial-min-time 0.2] [--repeats 5] [--brute-from DIR]

Runs `mpirun --oversubscribe` (as root it sets OMPI_ALLOW_RUN_AS_ROOT*). The
ranks share this machine's cores; the core count is printed with the numbers.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--trial-min-time", type=float, default=0.2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30, help="steps of each re-measuring run")
    ap.add_argument("--keep", help="keep the runs in this folder")
    ap.add_argument("--brute-from", help="reuse the brute-force run in this folder (a --keep folder's brute/)")
    a = ap.parse_args()
    weft = os.path.abspath(os.path.join(a.build, "weft"))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_WAIT_POLICY="passive")
    tmp = a.keep or tempfile.mkdtemp()
    os.makedirs(tmp, exist_ok=True)
    env["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")
    mpi = ["mpirun", "--oversubscribe", "-np", str(a.ranks), weft]
    common = ["--model", a.model, "--seq", str(a.seq), "--global-batch", str(a.global_batch),
              "--threads", "1", "--eval-samples", "8", "--eval-every", "0"]

    data = os.path.join(tmp, "data")
    if not os.path.exists(data):
        text = os.path.join(tmp, "corpus.txt")
        with open(text, "w") as f:
            for i in range(4000):
                f.write(f"Layouts are chosen by measurement {i * 7919 % 10007}, not by guess.\n%\n")
        subprocess.run([weft, "data", "prepare", "--input", text, "--out", data], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    common += ["--data", data]

    def tune(name, extra):
        out = os.path.join(tmp, name)
        t0 = time.time()
        subprocess.run(mpi + ["train", "--auto", "--retune", "--steps", "1", "--trial-min-time",
                              str(a.trial_min_time), "--out", out] + common + extra,
                       check=True, env=env, stdout=subprocess.DEVNULL)
        rep = json.load(open(os.path.join(out, "tuning.json")))
        rep["wall"] = time.time() - t0
        return rep

    print(f"model {a.model}, seq {a.seq}, global batch {a.global_batch}, fp32, {a.ranks} ranks x 1 thread "
          f"on {os.cpu_count()} cores", flush=True)
    if a.brute_from:
        brute = json.load(open(os.path.join(a.brute_from, "tuning.json")))
        print(f"brute force reused from {a.brute_from}")
    else:
        brute = tune("brute", ["--tune-all"])
    print(f"brute force: {len(brute['trials'])} of {brute['candidates']} candidates profiled in "
          f"{brute['profile_seconds']:.1f} s", flush=True)
    tuned = tune("tuner", [])
    print(f"tuner:       {len(tuned['trials'])} of {tuned['candidates']} candidates profiled in "
          f"{tuned['profile_seconds']:.1f} s ({tuned['stop_reason']})", flush=True)
    cal = tuned.get("calibration")
    if cal:
        print(f"cost model RMS error over the tuner's trials: {100 * cal['rms_error_before']:.1f}% with the "
              f"defaults, {100 * cal['rms_error_after']:.1f}% after the refit")

    # Re-measure both winners, alternating, so that drift hits both alike.
    winners = {"brute force": brute["winner"], "tuner": tuned["winner"]}
    rates = {k: [] for k in winners}
    for rep in range(a.repeats):
        for who, layout in winners.items():
            out = os.path.join(tmp, f"measure-{who.replace(' ', '-')}-{rep}")
            subprocess.run(mpi + ["train", "--layout", layout, "--steps", str(a.steps), "--log-every",
                                  str(a.steps // 2), "--out", out] + common,
                           check=True, env=env, stdout=subprocess.DEVNULL)
            rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
            rates[who].append(rows[-1]["tokens_per_s"])  # the window after warm-up
    med = {k: statistics.median(v) for k, v in rates.items()}
    print()
    print(f"{'':<12} {'winner':<66} {'tokens/s':>10} {'profiling':>11}")
    for who, rep in (("brute force", brute), ("tuner", tuned)):
        print(f"{who:<12} {winners[who]:<66} {med[who]:>10.0f} {rep['profile_seconds']:>10.1f}s")
    ratio = med["tuner"] / med["brute force"]
    frac = tuned["profile_seconds"] / brute["profile_seconds"]
    print(f"\ntuner / brute force: {100 * ratio:.1f}% of the tokens/s (target >= 95%), "
          f"{100 * frac:.1f}% of the profiling time (target <= 30%)")
    bt = {t["layout"]: t for t in brute["trials"]}
    tw = bt.get(winners["tuner"])
    if tw and tw["status"] == "ok":
        best = bt[winners["brute force"]]
        print(f"in the brute-force trials the tuner's winner measured {tw['tokens_per_s']:.0f} tokens/s, "
              f"the best {best['tokens_per_s']:.0f} ({100 * tw['tokens_per_s'] / best['tokens_per_s']:.1f}%)")
    return 0 if ratio >= 0.95 and frac <= 0.30 else 1


if __name__ == "__main__":
    sys.exit(main())
