#!/usr/bin/env python3
"""The cost model with a measured device profile against measured training
steps, for the layouts of benchmarks/multi_rank_layouts.py: for each rank
count, `weft calibrate` measures this machine under that mpirun (no refit
afterwards), `weft tune --dry-run --profile` predicts each layout's step, and
`weft train` measures it. Prints both and the error (target: within 10%),
and beside them the prediction from the datasheet constants (no profile).

    python3 benchmarks/profile_vs_measured.py [--build build] [--steps 24] [--min-time 0.1]
"""
import argparse, json, os, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from multi_rank_layouts import LAYOUTS  # noqa: E402

MODEL = ["--model", "small", "--seq", "256"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--min-time", type=float, default=0.1, help="seconds per calibration measurement")
    a = ap.parse_args()
    weft = os.path.abspath(os.path.join(a.build, "weft"))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_WAIT_POLICY="passive", WEFT_DEVICE="cpu")
    threads = ["--threads", str(a.threads)]

    def launch(np_, cmd):
        return (["mpirun", "--oversubscribe", "-np", str(np_)] if np_ > 1 else []) + cmd

    print(f"model small (6 layers, C=512), seq 256, global batch 8, fp32, {a.threads} thread per rank, "
          f"{os.cpu_count()} cores; profile measured under the same mpirun, no refit")
    print(f"{'ranks':>5}  {'layout':<24}{'predicted (s)':>15}{'measured (s)':>14}{'error':>9}"
          f"{'datasheet (s)':>14}{'error':>9}")
    errors, ds_errors = [], []
    with tempfile.TemporaryDirectory() as tmp:
        profiles = {}
        for np_ in sorted({n for n, _ in LAYOUTS}):
            p = os.path.join(tmp, f"profile{np_}.json")
            subprocess.run(launch(np_, [weft, "calibrate", *MODEL, "--mb", "1,2", *threads, "--min-time", str(a.min_time), "--out", p]),
                           check=True, env=env, stdout=subprocess.DEVNULL)
            profiles[np_] = p
        def predict(np_, layout, *profile):
            r = subprocess.run([weft, "tune", "--dry-run", *MODEL, "--global-batch", "8", "--gpu", "cpu",
                                "--gpus", str(np_), "--gpus-per-node", str(np_), "--layout", layout,
                                *profile, "--format", "json"],
                               check=True, env=env, capture_output=True, text=True)
            return json.loads(r.stdout)["layouts"][0]["prediction"]["step_s"]

        for np_, layout in LAYOUTS:
            predicted = predict(np_, layout, "--profile", profiles[np_])
            datasheet = predict(np_, layout)
            out = os.path.join(tmp, layout + str(np_))
            subprocess.run(launch(np_, [weft, "train", *MODEL, "--global-batch", "8", "--steps", str(a.steps),
                                        "--log-every", str(a.steps // 2), *threads, "--eval-samples", "8",
                                        "--layout", layout, "--out", out, "--no-checkpoint"]),
                           check=True, env=env, stdout=subprocess.DEVNULL)
            rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
            measured = rows[-1]["step_s"]  # the window after warm-up
            err = predicted / measured - 1
            errors.append(abs(err))
            ds_errors.append(abs(datasheet / measured - 1))
            print(f"{np_:>5}  {layout:<24}{predicted:>15.3f}{measured:>14.3f}{100 * err:>+8.1f}%"
                  f"{datasheet:>14.3f}{100 * (datasheet / measured - 1):>+8.1f}%", flush=True)
    print(f"mean |error| {100 * sum(errors) / len(errors):.1f}%, worst {100 * max(errors):.1f}%, "
          f"within 10%: {sum(e <= 0.10 for e in errors)} of {len(errors)}; datasheet constants: mean |error| "
          f"{100 * sum(ds_errors) / len(ds_errors):.1f}%, worst {100 * max(ds_errors):.1f}%")


if __name__ == "__main__":
    sys.exit(main())
