#!/usr/bin/env python3
"""weft's CUDA RMSNorm and cross-entropy next to PyTorch eager on the same
GPU, side by side in one run, at bench_gpu_kernels' shapes (a Llama-7B
micro-batch of 8192 tokens: C 4096, V 32000), bf16.

  rmsnorm: weft's fused forward (residual add, normalise, weight; fp32
    rstd kept) and fused backward, against two eager PyTorch forms: the
    composition a Llama implementation writes (the residual add, an fp32
    variance, rsqrt, the weight) and torch.nn.functional.rms_norm, each
    timed forward and backward (autograd, for dx and dweight).
  cross_entropy: weft's vocab-parallel loss with its gradient in place of
    the logits (max, sum of exponentials, loss and gradient: three passes,
    their medians summed), against F.cross_entropy on the bf16 logits and
    on logits upcast to fp32 first (as many training scripts do), each
    forward and backward.

Times are medians of CUDA-event-timed runs after warm-up, on random inputs
(never zeros). The speedup column is PyTorch's time over weft's: above
1.0x weft is faster. bench_gpu_kernels reports the same weft kernels against
the device's copy bandwidth (the 80% target); this script is the peer
comparison.

    python3 benchmarks/kernels_vs_pytorch.py [--build build] [--repeats 20]

Needs a CUDA GPU, torch with CUDA, and a CUDA build of weft
(benchmarks/bench_gpu_kernels).
"""
import json, os, subprocess, sys

from vs_pytorch import median_ms, parse_args

ROWS, C, V = 8192, 4096, 32000
EPS = 1e-6


def weft_times(build, repeats):
    """{benchmark name: median ms} for the rmsnorm and cross_entropy benchmarks."""
    exe = os.path.join(build, "benchmarks", "bench_gpu_kernels")
    out = subprocess.run([exe, "--benchmark_filter=rmsnorm/fused|cross_entropy", "--benchmark_format=json",
                          f"--benchmark_repetitions={repeats}", "--benchmark_report_aggregates_only=true"],
                         check=True, capture_output=True, text=True).stdout
    return parse_weft(out)


def parse_weft(text):
    rows = {}
    doc = json.loads(text) if text.strip() else {"benchmarks": []}
    for b in doc.get("benchmarks", []):
        if b.get("aggregate_name") != "median" or b.get("error_occurred"):
            continue
        # name: rmsnorm/fused_forward_residual_8192x4096/manual_time_median
        name = "/".join(b["name"].split("/")[:2])
        unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "us")]
        rows[name] = b["real_time"] * unit
    return rows


def torch_rmsnorm(warmup, repeats):
    """{form: (forward ms, backward ms)} for the eager forms."""
    import torch
    import torch.nn.functional as F
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    x = (torch.rand(ROWS, C, device=dev, generator=g) * 2 - 1).bfloat16().requires_grad_()
    res = (torch.rand(ROWS, C, device=dev, generator=g) * 2 - 1).bfloat16().requires_grad_()
    w = (torch.rand(C, device=dev, generator=g) + 0.5).bfloat16().requires_grad_()
    dy = (torch.rand(ROWS, C, device=dev, generator=g) * 2 - 1).bfloat16()

    def composed():
        s = x + res
        h = s.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return s, w * h.to(torch.bfloat16)

    forms = {"eager composition": composed}
    if hasattr(F, "rms_norm"):
        def functional():
            s = x + res
            return s, F.rms_norm(s, (C,), w, EPS)
        forms["F.rms_norm"] = functional
    out = {}
    for name, form in forms.items():
        fwd = median_ms(torch, form, warmup, repeats)
        _, y = form()
        bwd = median_ms(torch, lambda: torch.autograd.grad(y, (x, res, w), dy, retain_graph=True), warmup, repeats)
        out[name] = (fwd, bwd)
        del y
    return out, torch.cuda.get_device_name(), torch.__version__


def torch_cross_entropy(warmup, repeats):
    """{form: (forward ms, backward ms)}: mean loss over the rows, gradient to the bf16 logits."""
    import torch
    import torch.nn.functional as F
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(1)
    logits = (torch.rand(ROWS, V, device=dev, generator=g) * 16 - 8).bfloat16().requires_grad_()
    targets = torch.randint(0, V, (ROWS,), device=dev, generator=g)
    forms = {"bf16 logits": lambda: F.cross_entropy(logits, targets),
             "fp32 upcast": lambda: F.cross_entropy(logits.float(), targets)}
    out = {}
    for name, form in forms.items():
        fwd = median_ms(torch, form, warmup, repeats)
        loss = form()
        bwd = median_ms(torch, lambda: torch.autograd.grad(loss, logits, retain_graph=True), warmup, repeats)
        out[name] = (fwd, bwd)
        del loss
    return out


def row(kernel, impl, fwd, bwd, weft_total):
    total = fwd + bwd
    speed = f"{total / weft_total:7.2f}x" if weft_total else "      -"
    print(f"{kernel:>18} | {impl:>24} | {fwd:8.3f} {bwd:8.3f} {total:9.3f} | {speed}")


def main():
    a = parse_args()
    weft = weft_times(a.build, max(3, a.repeats // 4))
    norm, device, version = torch_rmsnorm(a.warmup, a.repeats)
    ce = torch_cross_entropy(a.warmup, a.repeats)
    print(f"{'kernel':>18} | {'impl':>24} | {'fwd ms':>8} {'bwd ms':>8} {'fwd+bwd':>9} | weft vs")
    status = 0

    w_fwd = weft.get("rmsnorm/fused_forward_residual_8192x4096")
    w_bwd = weft.get("rmsnorm/fused_backward_8192x4096")
    label = f"rmsnorm {ROWS}x{C}"
    if w_fwd is None or w_bwd is None:
        print(f"{label:>18} | {'weft fused':>24} | (no result)")
        status = 1
    else:
        row(label, "weft fused", w_fwd, w_bwd, 0)
    for name, (f, b) in norm.items():
        row(label, f"torch {name}", f, b, (w_fwd + w_bwd) if w_fwd and w_bwd else 0)

    parts = [weft.get(f"cross_entropy/{p}_{ROWS}x{V}") for p in ("max", "sum_exp", "loss_grad")]
    label = f"xent {ROWS}x{V}"
    if any(p is None for p in parts):
        print(f"{label:>18} | {'weft vocab-parallel':>24} | (no result)")
        status = 1
        w_total = 0
    else:
        # Forward: the max and the sum of exponentials; the last pass writes
        # the loss and the gradient together.
        w_total = sum(parts)
        row(label, "weft vocab-parallel", parts[0] + parts[1], parts[2], 0)
    for name, (f, b) in ce.items():
        row(label, f"torch {name}", f, b, w_total)
    print("the weft vs column: PyTorch's fwd+bwd time over weft's (above 1.0x weft is faster)")
    print(f"device: {device}; torch {version}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
