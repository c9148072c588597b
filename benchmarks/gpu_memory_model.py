#!/usr/bin/env python3
"""The memory model against the GPU: for single-GPU layouts (micro-batch
1/2/4, every checkpointing mode, flash, materialized and cudnn attention; a
build without the cuDNN frontend reports the cudnn rows as failed) weft trains
a few steps and writes, per memory category, the arena's high-water mark
beside the memory model's prediction (<out>/memory/rank0.json). The runtime
category is measured too: what cudaMemGetInfo counts beyond the arena (CUDA
context, cuBLAS and NCCL workspaces, allocator rounding). The table gives the
predicted and measured totals and their error; the target is within 5%.

    python3 benchmarks/gpu_memory_model.py [--weft build/weft]
        [--model llama3.2-1b] [--seq 2048] [--steps 3]

Needs a CUDA GPU and a CUDA build of weft.
"""
import argparse, itertools, json, os, re, subprocess, sys, tempfile


def preset_vocab(weft, model):
    """The vocabulary of a model preset, as `weft presets` lists it (None for
    a model it does not list, e.g. a config.json)."""
    out = subprocess.run([weft, "presets"], capture_output=True, text=True).stdout
    m = re.search(rf"^\s*{re.escape(model)} \(.*?\bV=(\d+)", out, re.M)
    return int(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weft", default="build/weft")
    ap.add_argument("--model", default="llama3.2-1b")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--vocab", type=int, help="the model's vocabulary, for the random ids (default: the preset's)")
    ap.add_argument("--data", help="token file or folder (default: random ids, memory does not depend on them)")
    ap.add_argument("--attn", default="flash,materialized,cudnn", help="attention kinds to measure (comma-separated)")
    a = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # rows show as they come, also through a pipe
    data = a.data
    if not data:
        import numpy as np
        vocab = a.vocab or preset_vocab(a.weft, a.model) or 128256
        data = os.path.join(tempfile.mkdtemp(prefix="weft-tokens-"), "tokens.npy")
        np.save(data, np.random.default_rng(0).integers(0, vocab, size=1 << 20, dtype=np.int32))
    gib = 1024.0 ** 3
    print(f"{'layout':<52}{'predicted':>11}{'measured':>11}{'error':>9}{'runtime pred/meas':>20}")
    worst, failed = 0.0, 0
    for mb, ckpt, attn in itertools.product((1, 2, 4), ("none", "selective", "ffn", "full"), a.attn.split(",")):
        layout = f"tp1-pp1-dp1-mb{mb}-ckpt:{ckpt}-attn:{attn}"
        out = tempfile.mkdtemp(prefix="weft-mem-")
        p = subprocess.run([a.weft, "train", "--data", data, "--model", a.model, "--seq", str(a.seq), "--global-batch",
                            str(2 * mb), "--layout", layout, "--steps", str(a.steps), "--eval-every", "0",
                            "--eval-samples", str(mb), "--device", "gpu", "--no-checkpoint", "--out", out],
                           capture_output=True, text=True)
        if p.returncode != 0:
            print(f"{layout:<52}  failed: {p.stderr.strip()[-200:]}")
            failed += 1
            continue
        m = json.load(open(os.path.join(out, "memory", "rank0.json")))
        pred, meas = sum(m["predicted"].values()), sum(m["measured"].values())
        err = (meas - pred) / pred
        worst = max(worst, abs(err))
        rt = f"{m['predicted']['overhead'] / gib:.2f}/{m['measured']['overhead'] / gib:.2f} GiB"
        print(f"{layout:<52}{pred / gib:>10.2f}G{meas / gib:>10.2f}G{100 * err:>+8.2f}%{rt:>20}")
    print(f"largest error {100 * worst:.2f}% (target: within 5%)" + (f"; {failed} layouts failed" if failed else ""))
    return 1 if failed or worst > 0.05 else 0


if __name__ == "__main__":
    sys.exit(main())
