#!/usr/bin/env python3
"""End-to-end training throughput: weft against PyTorch on the same GPU, side
by side in one run.

The model is the Llama 3.2 1B shape (V 128256, C 2048, L 16, H 32, H_kv 8,
F 8192, tied embeddings) at T = 2048, bf16 compute with fp32 master weights
and fused AdamW on both sides. For each micro-batch size (1 and --mb-list)
the script runs, each side accumulating gradients over 4 micro-batches per
optimizer step (global batch 4 x mb) and clipping the gradient norm at 1,

  weft     `weft train --layout tp1-pp1-dp1-mb<mb>-attn:<flash|cudnn>` on the GPU (it reads
           tokens/s, TFLOP/s and MFU from the run's metrics.jsonl, and the
           dense bf16 peak from its log);
  eager    a plain PyTorch Llama (nn.Linear, RMSNorm, rotary, GQA through
           scaled_dot_product_attention on the flash backend, SwiGLU) under
           torch.autocast(bfloat16), fp32 parameters, AdamW(fused=True);
  compile  the same module through torch.compile (skipped, with the reason
           printed, where it fails).

Both count model FLOPs the way weft does (6 N + 12 L C T per token, N every
matmul weight including the LM head, the causal halving not taken) against
the same peak, so the MFU columns compare directly. The last line gives weft
over eager and over compile at each weft's best micro-batch.

    python3 benchmarks/mfu_vs_pytorch.py [--weft build/weft] [--steps 20]
        [--mb-list 1,2,4] [--model llama3.2-1b] [--seq 2048] [--accum 4]
        [--grads fp32,bf16]

--accum sets the micro-batches per step; --grads bf16 adds weft rows with
bf16 gradients (grad:bf16), shown beside the fp32 ones and compared apart,
since PyTorch's gradients here are fp32.

Needs a CUDA GPU, torch with CUDA, and a CUDA build of weft.
"""
import argparse, itertools, json, math, os, re, subprocess, sys, tempfile, time

SHAPES = {
    # name: V, C, F, L, H, H_kv, tied
    "llama3.2-1b": (128256, 2048, 8192, 16, 32, 8, True),
    "tiny": (256, 128, 352, 4, 4, 2, False),
}


def flops_per_token(V, C, F, L, H, Hkv, tied, T):
    D = C // H
    block = C * (H * D) + 2 * C * (Hkv * D) + (H * D) * C + 3 * C * F + 2 * C
    n = L * block + C + V * C  # blocks, final norm, LM head (not the lookup)
    return 6.0 * n + 12.0 * L * C * T


def random_tokens(V, n=1 << 22):
    """A token file of uniform random ids (throughput does not depend on the
    text), so the benchmark needs no corpus on the GPU machine."""
    import numpy as np
    path = os.path.join(tempfile.mkdtemp(prefix="weft-tokens-"), "tokens.npy")
    np.save(path, np.random.default_rng(0).integers(0, V, size=n, dtype=np.int32))
    return path


def run_weft(weft, model, T, mb, attn, steps, gb, data, grad="fp32"):
    out = tempfile.mkdtemp(prefix="weft-mfu-")
    cmd = [weft, "train", "--data", data, "--model", model, "--seq", str(T), "--global-batch", str(gb),
           "--layout", f"tp1-pp1-dp1-mb{mb}-attn:{attn}-grad:{grad}", "--steps", str(steps), "--log-every", "5",
           "--eval-every", "0", "--eval-samples", str(mb), "--device", "gpu", "--no-checkpoint", "--out", out]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None, None, f"weft exited {p.returncode}: {p.stderr.strip()[-300:]}"
    peak = re.search(r"stated peak of ([0-9.]+) GFLOP/s", p.stdout)
    metrics = os.path.join(out, "metrics.jsonl")
    rows = [json.loads(l) for l in open(metrics)] if os.path.exists(metrics) else []
    rows = [r for r in rows if r.get("kind") == "train"]  # the step windows, not the run's summary
    if not rows:
        return None, None, f"no step rows in {metrics}"
    last = rows[-1]  # the last window, past warm-up
    return last, float(peak.group(1)) * 1e9 if peak else None, None


def torch_model(V, C, F, L, H, Hkv, tied):
    import torch
    import torch.nn as nn
    import torch.nn.functional as Fn

    D = C // H

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(C))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * self.weight

    def rope(x, cos, sin):
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.q = nn.Linear(C, H * D, bias=False)
            self.k = nn.Linear(C, Hkv * D, bias=False)
            self.v = nn.Linear(C, Hkv * D, bias=False)
            self.o = nn.Linear(H * D, C, bias=False)
            self.g = nn.Linear(C, F, bias=False)
            self.u = nn.Linear(C, F, bias=False)
            self.d = nn.Linear(F, C, bias=False)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            h = self.n1(x)
            q = self.q(h).view(B, T, H, D).transpose(1, 2)
            k = self.k(h).view(B, T, Hkv, D).transpose(1, 2)
            v = self.v(h).view(B, T, Hkv, D).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            a = Fn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.o(a.transpose(1, 2).reshape(B, T, H * D))
            h = self.n2(x)
            return x + self.d(Fn.silu(self.g(h)) * self.u(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.norm = RMSNorm()
            self.head = nn.Linear(C, V, bias=False)
            if tied:
                self.head.weight = self.emb.weight

        def forward(self, tokens, targets):
            T = tokens.shape[1]
            inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=tokens.device).float() / D))
            ang = torch.outer(torch.arange(T, device=tokens.device).float(), inv)
            cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
            x = self.emb(tokens)
            for b in self.blocks:
                x = b(x, cos, sin)
            logits = self.head(self.norm(x))
            return Fn.cross_entropy(logits.view(-1, V).float(), targets.view(-1))

    return Llama


def run_torch(shape, T, mb, accum, steps, compiled):
    """Tokens/s of optimizer steps of accum micro-batches of mb sequences
    each (weft's global batch mb x accum), median over steps."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    V = shape[0]
    torch.manual_seed(0)
    model = torch_model(*shape)().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    step_fn = torch.compile(model) if compiled else model
    tokens = torch.randint(0, min(V, 256), (mb, T + 1), device="cuda")
    inp, tgt = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    warmup = 3 if not compiled else 5
    times = []
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        for i in range(warmup + steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(accum):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = step_fn(inp, tgt) / accum
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    times.sort()
    return accum * mb * T / times[len(times) // 2]


def release_torch():
    """Hand the caching allocator's memory back to the driver and drop
    torch.compile's caches, so the next weft run (a separate process) finds
    the GPU free and the next compile starts afresh (not from a graph made
    dynamic in the batch by the previous micro-batch size)."""
    import gc
    import torch
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weft", default="build/weft")
    ap.add_argument("--model", default="llama3.2-1b", choices=sorted(SHAPES))
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--mb-list", default="1,2,4")
    ap.add_argument("--data", help="token file or folder for weft (default: random ids)")
    ap.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step on both sides")
    ap.add_argument("--grads", default="fp32", help="weft's gradient types to run (fp32, bf16 or both); "
                    "PyTorch keeps fp32 gradients, so the ratios compare the fp32 rows and a bf16 row is "
                    "shown beside them")
    a = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # rows show as they come, also through a pipe
    shape = SHAPES[a.model]
    data = a.data or random_tokens(shape[0])
    fpt = flops_per_token(*shape, a.seq)
    mbs = [int(x) for x in a.mb_list.split(",")]
    accum = a.accum
    rows, peak = [], None
    print(f"model {a.model}, T {a.seq}, {fpt / 1e9:.2f} GFLOP per token (6N + 12LCT)")
    print(f"{'side':<17}{'mb':>4}{'tokens/s':>12}{'TFLOP/s':>10}{'MFU':>8}  note")
    for mb in mbs:
        # weft with each of its GPU attention kernels (the tuner would pick the faster).
        for attn, grad in itertools.product(("flash", "cudnn"), a.grads.split(",")):
            w, p, err = run_weft(a.weft, a.model, a.seq, mb, attn, a.steps, mb * accum, data, grad)
            peak = peak or p
            side = f"weft-{attn}" + ("" if grad == "fp32" else f"-g:{grad}")
            if w:
                rows.append(("weft" if grad == "fp32" else f"weft grad:{grad}", mb, w["tokens_per_s"]))
                print(f"{side:<17}{mb:>4}{w['tokens_per_s']:>12.0f}{w['tflops_per_device']:>10.1f}{100 * w['mfu']:>7.1f}%")
            else:
                print(f"{side:<17}{mb:>4}{'-':>12}{'-':>10}{'-':>8}  {err}")
        for compiled in (False, True):
            side = "compile" if compiled else "eager"
            try:
                tps = run_torch(shape, a.seq, mb, accum, a.steps, compiled)
            except Exception as e:  # out of memory, a compile failure: say so and go on
                print(f"{side:<17}{mb:>4}{'-':>12}{'-':>10}{'-':>8}  {type(e).__name__}: {str(e)[:120]}")
                continue
            finally:
                release_torch()
            rows.append((side, mb, tps))
            mfu = f"{100 * tps * fpt / peak:>7.1f}%" if peak else f"{'?':>8}"
            print(f"{side:<17}{mb:>4}{tps:>12.0f}{tps * fpt / 1e12:>10.1f}{mfu}")
    if peak:
        print(f"peak: {peak / 1e12:.0f} TFLOP/s dense bf16 (weft's DeviceSpec for this GPU)")
    sides = ["weft"] + [f"weft grad:{g}" for g in a.grads.split(",") if g != "fp32"]
    best = {s: max((t for side, _, t in rows if side == s), default=None) for s in sides + ["eager", "compile"]}
    for mine in sides:
        for other in ("eager", "compile"):
            if best[mine] and best[other]:
                print(f"{mine} / {other} (best micro-batch each): {best[mine] / best[other]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
