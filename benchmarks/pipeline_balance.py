#!/usr/bin/env python3
"""Pipeline balance: how the even split and the tuner's own split spread the
stage times of Llama 3.1 8B, 70B and 405B (128k vocabulary), and the tuner's
split against the published one.

For each case, the dry-run's best layout with the split pinned even (where L
divides) and with the split searched, and for 405B the published recipe
(tp 8, cp 2, pp 8 x vpp 8, the embedding and the loss counted as layers).
Each row prints the cost model's time per micro-batch of every stage
(`stage_times_s` of the dry-run's JSON), the slowest over the mean, the
predicted step and MFU. No GPU is needed: these are the models' numbers.

    python3 benchmarks/pipeline_balance.py [--build build]
"""
import argparse, json, subprocess, sys

CASES = [
    # model, GPUs, seq, global batch, pins that hold the pipeline so the
    # split is what differs (the whole space's best may not pipeline at all)
    ("llama3.1-8b", 64, 8192, 512, ["--tp", "4", "--pp", "4", "--cp", "1"]),
    ("llama3.1-70b", 256, 8192, 512, ["--tp", "8", "--pp", "4", "--cp", "1"]),
    ("llama3.1-405b", 1024, 8192, 512, ["--tp", "8", "--pp", "8", "--cp", "2"]),
]
PUBLISHED_405B = "tp8-cp2-pp8-dp8-mb1-vpp8-sp-ckpt:none-attn:cudnn-norm:fused-zero1-grad:fp32-cp:ring-split:1.2x62.1"


def dry_run(weft, model, gpus, seq, batch, extra):
    cmd = [weft, "tune", "--dry-run", "--model", model, "--gpu", "h100", "--gpus", str(gpus), "--seq", str(seq),
           "--global-batch", str(batch), "--format", "json", "--top", "1"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        if "none of the" in r.stderr + r.stdout:  # no valid layout: e.g. no even split of L
            return (r.stderr + r.stdout).strip().splitlines()[-1]
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")
    rows = json.loads(r.stdout)["layouts"]
    return rows[0] if rows else None


def spread(times):
    return max(times) * len(times) / sum(times) - 1


def line(name, row):
    if row is None:
        return f"| {name} | (nothing fits) | | | | |"
    if isinstance(row, str):
        return f"| {name} | {row.replace('weft: error: ', '')} | | | | |"
    t = row.get("stage_times_s", [])
    p = row["prediction"]
    stages = ", ".join(f"{x * 1e3:.0f}" for x in t)
    return (f"| {name} | `{row['layout']}` | {stages} | {100 * spread(t):.1f}% | "
            f"{p['step_s']:.2f} s | {100 * p['mfu']:.1f}% |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    a = ap.parse_args()
    weft = f"{a.build}/weft"
    print("| case | layout | stage times per micro-batch (ms) | slowest over mean | step | MFU |")
    print("|---|---|---|---|---|---|")
    for model, gpus, seq, batch, pins in CASES:
        where = f"{model}, {gpus} H100, T={seq}, batch {batch}"
        even = dry_run(weft, model, gpus, seq, batch, pins + ["--split", "even"])
        print(line(f"{where}: even split", even))
        best = dry_run(weft, model, gpus, seq, batch, pins)
        print(line(f"{where}: split searched", best))
        if model == "llama3.1-405b":
            pub = dry_run(weft, model, gpus, seq, batch, ["--layout", PUBLISHED_405B])
            print(line(f"{where}: published recipe", pub))
            free = dry_run(weft, model, gpus, seq, batch, [])
            print(line(f"{where}: whole space", free))


if __name__ == "__main__":
    main()
