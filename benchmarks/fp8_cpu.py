#!/usr/bin/env python3
"""Emulated FP8 on the CPU: the tiny and small Llamas trained the same steps
from the same seed and data in fp32 and with FP8 GEMMs (tensorwise, delayed
and block scaling), on the built-in default data. Prints, per model and
recipe, the final loss (mean of the last 10 steps' losses, which smooths the
batch-to-batch noise), its relative difference to fp32 (target: within 2%),
the validation loss, and the quantisation health: the share of quantised
values that overflowed (clamped) or underflowed (became zero).

    python3 benchmarks/fp8_cpu.py [--build build] [--steps 200] [--models tiny,small]
                                  [--recipes tensorwise,delayed,blockwise]

Every GEMM of these models is FP8 under tensorwise and delayed scaling: their
dimensions and B*T are multiples of 16. Block scaling needs multiples of 128
(core/layout.h), so it quantises only some: the "values" column says how many
values a step quantises.
"""
import argparse, json, os, subprocess, sys, tempfile

SHAPES = {"tiny": (256, 8), "small": (128, 8)}  # seq, global batch


def train(weft, tmp, model, layout, steps):
    seq, gb = SHAPES[model]
    out = os.path.join(tmp, f"{model}-{layout.replace(':', '_')}")
    cmd = [weft, "train", "--model", model, "--seq", str(seq), "--global-batch", str(gb), "--steps", str(steps),
           "--log-every", "1", "--eval-every", str(steps), "--eval-samples", "16", "--layout", layout,
           "--out", out, "--no-checkpoint"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, WEFT_DEVICE="cpu"))
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    train_rows = [r for r in rows if r.get("kind") == "train"]
    val = [r["val_loss"] for r in rows if r.get("kind") == "val"]
    fp8 = {"values": 0, "overflow": 0, "underflow": 0}
    for r in train_rows:
        for k in fp8:
            fp8[k] += r.get("fp8", {}).get(k, 0)
    last = [r["loss"] for r in train_rows[-10:]]
    return {"final": sum(last) / len(last), "val": val[-1] if val else float("nan"), "fp8": fp8,
            "step_s": sum(r["step_s"] for r in train_rows) / len(train_rows)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--models", default="tiny,small")
    ap.add_argument("--recipes", default="tensorwise,delayed,blockwise")
    a = ap.parse_args()
    weft = os.path.abspath(os.path.join(a.build, "weft"))
    print(f"{a.steps} steps, mb 1, 1 rank, built-in data, {os.cpu_count()} cores; final = mean loss of the last 10 steps")
    print(f"{'model':<7}{'GEMMs':<18}{'final':>9}{'vs fp32':>10}{'val':>9}{'values':>10}{'overflow':>11}"
          f"{'underflow':>11}{'s/step':>9}")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models.split(","):
            ref = None
            for recipe in [""] + [f"fp8:{r}" for r in a.recipes.split(",")]:
                layout = "tp1-pp1-dp1-mb1" + (f"-{recipe}" if recipe else "")
                r = train(weft, tmp, model, layout, a.steps)
                if ref is None:
                    ref = r
                rel = (r["final"] - ref["final"]) / ref["final"]
                n = max(1, r["fp8"]["values"])
                over = f"{100 * r['fp8']['overflow'] / n:.4f}%" if recipe else "-"
                under = f"{100 * r['fp8']['underflow'] / n:.4f}%" if recipe else "-"
                values = r["fp8"]["values"] // a.steps if recipe else 0
                print(f"{model:<7}{recipe or 'fp32':<18}{r['final']:>9.4f}{100 * rel:>9.2f}%{r['val']:>9.4f}"
                      f"{values:>10}{over:>11}{under:>11}{r['step_s']:>9.3f}")
                if recipe and abs(rel) > 0.02:
                    ok = False
    print("target (final loss within 2% of fp32):", "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
