#!/usr/bin/env python3
"""Training stall per checkpoint save, synchronous against asynchronous.

    python3 benchmarks/checkpoint_stall.py [--weft build/weft] [--steps 25] [--every 3]

Trains each model twice on the default corpus with a checkpoint every
--every steps: with --sync-checkpoints (each save writes its folder before
training goes on) and without (the default: the state is gathered into host
memory at the step boundary and a thread writes it while the next steps
run). Prints, per model and mode, the stall of the periodic saves (the
metrics' checkpoint records: what training waited for): the mean of all of
them, and the median of those after the first two (the steady state: the
first two allocate the gather's buffers, later ones reuse a written save's),
the median step time and the wall time of the whole run. The final save is
always synchronous and is left out.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

# A ~100M-parameter model (byte vocabulary) beside the `small` preset.
MEDIUM = {"vocab_size": 256, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
          "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64, "rms_norm_eps": 1e-5,
          "rope_theta": 10000.0, "tie_word_embeddings": False}


def run(weft, model, steps, every, sync, out):
    cmd = [weft, "train", "--model", model, "--seq", "64", "--global-batch", "4", "--layout", "tp1-pp1-dp1-mb2",
           "--steps", str(steps), "--ckpt-every", str(every), "--log-every", "1", "--eval-every", "0",
           "--eval-samples", "2", "--out", out]
    if sync:
        cmd.append("--sync-checkpoints")
    t0 = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.time() - t0
    stalls, steps_s = [], []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "checkpoint" and r["step"] < steps:
                stalls.append(r["stall_s"])
            if r.get("kind") == "train":
                steps_s.append(r["step_s"])
    return statistics.mean(stalls), statistics.median(stalls[2:] or stalls), statistics.median(steps_s), wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", default="build/weft")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--every", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        medium = os.path.join(tmp, "medium.json")
        with open(medium, "w") as f:
            json.dump(MEDIUM, f)
        print(f"{'model':<10} {'mode':<6} {'stall mean':>11} {'steady':>9} {'step (median)':>14} {'run wall':>9}")
        for name, model in (("small", "small"), ("medium", medium)):
            for sync in (True, False):
                stall, steady, step, wall = run(a.weft, model, a.steps, a.every, sync,
                                                os.path.join(tmp, f"{name}-{sync}"))
                print(f"{name:<10} {'sync' if sync else 'async':<6} {stall:>10.3f}s {steady:>8.3f}s {step:>13.3f}s "
                      f"{wall:>8.1f}s")


if __name__ == "__main__":
    main()
