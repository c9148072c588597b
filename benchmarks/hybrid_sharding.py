#!/usr/bin/env python3
"""Hybrid sharding in the dry-run: ZeRO over every dp x cp rank against ZeRO
within shard groups (zeroN@G) on H100 clusters (8 GPUs a node on NVLink,
one 400 Gb/s port per GPU), and what the tuner picks with the group free.

For each case the dry-run's best layout with the parallel degrees pinned as
shown and the ZeRO stage and shard group pinned per row; then the tuner's
own best with the group free (the search adds, for ZeRO-3, the group that
fills a node with its tp ranks). Each row prints the cost
model's step, its data-parallel part (the reduce-scatters and gathers, and
under hybrid sharding the replicas' all-reduce), the optimizer, the
memory model's peak per GPU and the MFU. No GPU is needed: these are the
models' numbers.

    python3 benchmarks/hybrid_sharding.py [--build build]
"""
import argparse, json, subprocess, sys

CASES = [
    # model, GPUs, seq, global batch, pins (the degrees), rows (zero, group)
    ("llama3.1-8b", 256, 8192, 512, ["--tp", "1", "--pp", "1", "--cp", "1", "--mb", "1"],
     [(3, 0), (3, 8), (3, 16), (1, 0), (1, 8)]),
    ("llama3.1-8b", 1024, 8192, 1024, ["--tp", "1", "--pp", "1", "--cp", "1", "--mb", "1"],
     [(3, 0), (3, 8), (3, 64), (2, 8)]),
    ("llama3.1-70b", 512, 8192, 512, ["--tp", "2", "--pp", "1", "--cp", "1", "--mb", "1"],
     [(3, 0), (3, 4), (3, 16), (3, 64)]),
    ("llama3.1-405b", 2048, 8192, 1024, ["--tp", "8", "--pp", "8", "--cp", "2", "--vpp", "8"],
     [(1, 0), (1, 2), (1, 4)]),
]


def dry_run(weft, model, gpus, seq, batch, extra):
    cmd = [weft, "tune", "--dry-run", "--model", model, "--gpu", "h100", "--gpus", str(gpus), "--seq", str(seq),
           "--global-batch", str(batch), "--format", "json", "--top", "1"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return (r.stderr + r.stdout).strip().splitlines()[-1]
    rows = json.loads(r.stdout)["layouts"]
    return rows[0] if rows else "no layout"


def row(label, r):
    if isinstance(r, str):
        return f"| {label} | {r} | | | | | | |"
    p = r["prediction"]
    fits = "fits" if r["verdict"] == "fits" else r["verdict"]
    return (f"| {label} | `{r['layout']}` | {p['step_s']:.2f} s | {p['dp_comm_s'] * 1e3:.0f} ms | "
            f"{p['optimizer_s'] * 1e3:.0f} ms | {r['memory_peak_bytes'] / 2**30:.1f} GiB | {fits} | {p['mfu']:.1%} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    a = ap.parse_args()
    weft = f"{a.build}/weft"
    print("| case | layout | step | dp comm | optimizer | peak/GPU | verdict | MFU |")
    print("|---|---|---|---|---|---|---|---|")
    for model, gpus, seq, batch, pins, rows in CASES:
        case = f"{model}, {gpus} H100, T={seq}, batch {batch}"
        for zero, group in rows:
            r = dry_run(weft, model, gpus, seq, batch, pins + ["--zero", str(zero), "--zero-group", str(group)])
            print(row(f"{case}: zero{zero}" + (f"@{group}" if group else ""), r), flush=True)
        print(row(f"{case}: tuner (ZeRO and group free)", dry_run(weft, model, gpus, seq, batch, pins)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
