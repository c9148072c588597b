#!/usr/bin/env python3
"""weft's CUDA attention kinds next to PyTorch's scaled_dot_product_attention
(flash backend), forward and forward + backward, side by side: weft's own
flash kernels, cuDNN's fused SDPA (the cudnn kind, in builds with the cuDNN
frontend), and "weft best", the faster of the two per shape, which is what
the tuner would pick. The target: weft best at least 1.0x PyTorch's
forward + backward speed.

Shapes as in bench_gpu_attention: bf16, causal, H 32, H_kv 8 (GQA 4:1),
D 128, T 2048 with B 8 and T 8192 with B 2. TFLOP/s count the causal work
only: 4 B H D T (T + 1) / 2 for the forward, 2.5 times that for the backward.
PyTorch is timed with CUDA events, median of --repeats after --warmup runs,
on random inputs. GQA goes through enable_gqa=True where the flash backend
takes it; otherwise K and V are expanded to H heads beforehand, outside the
timed region, and the table says so.

    python3 benchmarks/attention_vs_pytorch.py [--build build] [--repeats 20]

Needs a CUDA GPU, torch with CUDA, and a CUDA build of weft
(benchmarks/bench_gpu_attention).
"""
import json, os, subprocess, sys

from vs_pytorch import median_ms, parse_args

SHAPES = [(8, 2048), (2, 8192)]  # (B, T)
H, H_KV, D = 32, 8, 128


def forward_flops(B, T):
    return 4.0 * B * H * D * T * (T + 1) / 2


def torch_times(B, T, warmup, repeats):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    q = (torch.rand(B, H, T, D, device=dev, generator=g) * 4 - 2).bfloat16().requires_grad_()
    k = (torch.rand(B, H_KV, T, D, device=dev, generator=g) * 4 - 2).bfloat16().requires_grad_()
    v = (torch.rand(B, H_KV, T, D, device=dev, generator=g) * 2 - 1).bfloat16().requires_grad_()
    dout = (torch.rand(B, H, T, D, device=dev, generator=g) * 2 - 1).bfloat16()

    gqa = "enable_gqa"
    kk, vv, kwargs = k, v, {"enable_gqa": True}
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        try:
            F.scaled_dot_product_attention(q, k, v, is_causal=True, **kwargs)
        except (RuntimeError, TypeError):
            gqa = "kv expanded"
            kk = k.detach().repeat_interleave(H // H_KV, dim=1).requires_grad_()
            vv = v.detach().repeat_interleave(H // H_KV, dim=1).requires_grad_()
            kwargs = {}

        def fwd():
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, **kwargs)

        def fwd_bwd():
            o = fwd()
            o.backward(dout)

        def clear_grads():
            q.grad = kk.grad = vv.grad = None

        def timed(fn):
            return median_ms(torch, fn, warmup, repeats, before_each=clear_grads)

        with torch.no_grad():
            f_ms = timed(fwd)
        fb_ms = timed(fwd_bwd)
    return {"fwd_ms": f_ms, "fwd_bwd_ms": fb_ms, "gqa": gqa, "torch": torch.__version__,
            "device": torch.cuda.get_device_name()}


KINDS = ("flash", "cudnn")  # the materialized kind is no contender at these T


def weft_times(build, repeats):
    """{(kind, B, T): times} for each weft kind that ran (a build without the
    cuDNN frontend skips cudnn, which then reads "(no result)")."""
    exe = os.path.join(build, "benchmarks", "bench_gpu_attention")
    out = subprocess.run([exe, f"--benchmark_filter={'|'.join(KINDS)}", "--benchmark_format=json",
                          f"--benchmark_repetitions={repeats}",
                          "--benchmark_report_aggregates_only=true"],
                         check=True, capture_output=True, text=True).stdout
    rows = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") != "median" or b.get("error_occurred"):
            continue
        # name: attention_fwd_bwd/cudnn/B8_T2048_H32_Hkv8_D128/manual_time_median
        parts = b["name"].split("/")
        kind, shape = parts[1], parts[2]
        B = int(shape.split("_")[0][1:])
        T = int(shape.split("_")[1][1:])
        rows[(kind, B, T)] = {"fwd_ms": b["fwd_ms"], "fwd_bwd_ms": b["fwd_ms"] + b["bwd_ms"]}
    return rows


def main():
    a = parse_args()
    weft = weft_times(a.build, max(3, a.repeats // 4))
    print(f"{'shape':>22} | {'impl':>22} | {'fwd ms':>8} {'fwd TFLOP/s':>12} | "
          f"{'fwd+bwd ms':>10} {'fwd+bwd TFLOP/s':>16} | {'vs torch':>8}")
    device = None
    for B, T in SHAPES:
        ff = forward_flops(B, T)
        t = torch_times(B, T, a.warmup, a.repeats)
        device = t["device"]
        mine = [(f"weft {kind}", weft.get((kind, B, T))) for kind in KINDS]
        ran = [(name, r) for name, r in mine if r is not None]
        best = min(ran, key=lambda x: x[1]["fwd_bwd_ms"]) if ran else None
        rows = mine + [(f"weft best ({best[0][5:]})" if best else "weft best", best[1] if best else None),
                       (f"torch ({t['gqa']})", t)]
        label = f"B{B} T{T} H{H}/{H_KV} D{D}"
        for name, r in rows:
            if r is None:
                print(f"{label:>22} | {name:>22} | (no result)")
                continue
            # Speed relative to PyTorch's forward + backward: above 1.0x is faster.
            ratio = t["fwd_bwd_ms"] / r["fwd_bwd_ms"]
            print(f"{label:>22} | {name:>22} | {r['fwd_ms']:8.3f} "
                  f"{ff / r['fwd_ms'] / 1e9:12.1f} | {r['fwd_bwd_ms']:10.3f} "
                  f"{3.5 * ff / r['fwd_bwd_ms'] / 1e9:16.1f} | {ratio:7.2f}x")
        if best:
            verdict = "meets" if t["fwd_bwd_ms"] / best[1]["fwd_bwd_ms"] >= 1.0 else "misses"
            print(f"{label:>22} | weft best {verdict} the 1.0x PyTorch SDPA fwd+bwd target")
    print(f"device: {device}", file=sys.stderr)


if __name__ == "__main__":
    main()
