#!/usr/bin/env python3
"""The memory model against the GPU: for single-GPU layouts (micro-batch
1/2/4, every checkpointing mode, flash, materialized and cudnn attention; a
build without the cuDNN frontend reports the cudnn rows as failed) weft trains
a few steps and writes, per memory category, the arena's high-water mark
beside the memory model's prediction (<out>/memory/rank0.json), which must be
equal. The device's own count is read apart from weft: nvidia-smi polls the
GPU's used memory while the run trains, less what was used before it
started, so it holds everything the process took (the arena's reservation
with its slack, the CUDA context, library handles and their workspaces).
The table gives the model's total against that count; the target is within
5%, and the runtime's measured share (device less the reservation) is what
the memory model's stated overhead should be.

    python3 benchmarks/gpu_memory_model.py [--weft build/weft]
        [--model llama3.2-1b] [--seq 2048] [--steps 3] [--mb-list 1,2,4] [--ckpt-list none,full]

Needs a CUDA GPU and a CUDA build of weft.
"""
import argparse, itertools, json, os, re, subprocess, sys, tempfile, time


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
    ap.add_argument("--mb-list", default="1,2,4", help="micro-batch sizes to measure (comma-separated)")
    ap.add_argument("--ckpt-list", default="none,selective,ffn,full", help="checkpointing modes (comma-separated)")
    a = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # rows show as they come, also through a pipe
    data = a.data
    if not data:
        import numpy as np
        vocab = a.vocab or preset_vocab(a.weft, a.model) or 128256
        data = os.path.join(tempfile.mkdtemp(prefix="weft-tokens-"), "tokens.npy")
        np.save(data, np.random.default_rng(0).integers(0, vocab, size=1 << 20, dtype=np.int32))
    gib = 1024.0 ** 3
    print(f"{'layout':<44}{'model':>9}{'arena':>9}{'reserved':>10}{'device':>9}{'runtime':>9}{'error':>9}")
    worst, failed, runtimes = 0.0, 0, []
    for mb, ckpt, attn in itertools.product([int(x) for x in a.mb_list.split(",")], a.ckpt_list.split(","),
                                            a.attn.split(",")):
        layout = f"tp1-pp1-dp1-mb{mb}-ckpt:{ckpt}-attn:{attn}"
        out = tempfile.mkdtemp(prefix="weft-mem-")
        before = gpu_used()
        p = subprocess.Popen([a.weft, "train", "--data", data, "--model", a.model, "--seq", str(a.seq), "--global-batch",
                              str(2 * mb), "--layout", layout, "--steps", str(a.steps), "--eval-every", "0",
                              "--eval-samples", str(mb), "--device", "gpu", "--no-checkpoint", "--out", out],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        peak = watch_peak(p, before)
        stdout, stderr = p.communicate()
        if p.returncode != 0:
            print(f"{layout:<44}  failed: {stderr.strip()[-200:]}")
            failed += 1
            continue
        m = json.load(open(os.path.join(out, "memory", "rank0.json")))
        pred = sum(m["predicted"].values())
        arena = sum(v for k, v in m["measured"].items() if k != "overhead")
        arena_pred = sum(v for k, v in m["predicted"].items() if k != "overhead")
        reserved = m.get("arena_reserved", 0)
        runtime = peak - reserved
        runtimes.append(runtime)
        err = (peak - pred) / pred
        worst = max(worst, abs(err))
        if arena != arena_pred:
            print(f"{layout:<44}  the arena's peak {arena} bytes differs from the model's {arena_pred}")
            failed += 1
        print(f"{layout:<44}{pred / gib:>8.2f}G{arena / gib:>8.2f}G{reserved / gib:>9.2f}G{peak / gib:>8.2f}G"
              f"{runtime / gib:>8.2f}G{100 * err:>+8.2f}%")
    print("model: the memory model's total (its categories and the stated runtime overhead); arena: the "
          "arena's peak, which must equal the model's categories; reserved: what the arena took up front "
          "(the categories and a slack); device: the driver's count of used device memory at its highest "
          "while the run ran, less what was used before it started (nvidia-smi, every 50 ms); runtime: "
          "device less reserved (CUDA context, library handles and their workspaces)")
    if runtimes:
        print(f"runtime measured: {min(runtimes) / gib:.2f} to {max(runtimes) / gib:.2f} GiB")
    print(f"largest error of the model against the device {100 * worst:.2f}% (target: within 5%)" +
          (f"; {failed} layouts failed" if failed else ""))
    return 1 if failed or worst > 0.05 else 0


def gpu_used():
    """The driver's count of used memory on GPU 0, in bytes (nvidia-smi, MiB)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True).stdout
    return int(out.split()[0]) * 1024 * 1024


def watch_peak(proc, before):
    """Polls the device's used memory while proc runs; returns its highest
    value less `before`, the memory in use before proc started."""
    peak = 0
    while proc.poll() is None:
        peak = max(peak, gpu_used() - before)
        time.sleep(0.05)
    return peak


if __name__ == "__main__":
    sys.exit(main())
