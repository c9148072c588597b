#!/usr/bin/env python3
"""One CPU training step of the same small Llama in weft and in PyTorch eager,
side by side with the same thread count: tokens/s of each and their ratio.

Model: weft's "small" preset (6 layers, C=512, 8 heads, F=1376, V=256),
T=256, B=8, fp32, AdamW. PyTorch runs transformers' LlamaForCausalLM with
eager attention (SDPA where asked), fused-free AdamW (foreach), no compile.

    python3 benchmarks/cpu_step_vs_pytorch.py [--build build] [--threads 2] [--steps 5]

Needs torch and transformers (pip install torch transformers).
"""
import argparse, json, os, subprocess, sys, time


def pytorch_step(threads, steps, seq, batch, attn):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=1376, num_hidden_layers=6,
                      num_attention_heads=8, num_key_value_heads=8, head_dim=64,
                      max_position_embeddings=seq, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      attn_implementation=attn)
    model = LlamaForCausalLM(cfg).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    x = torch.randint(0, 256, (batch, seq))
    y = torch.randint(0, 256, (batch, seq))

    def one():
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, 256), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    one()
    t0 = time.perf_counter()
    for _ in range(steps):
        one()
    dt = (time.perf_counter() - t0) / steps
    return {"impl": f"pytorch-eager-{attn}", "threads": threads, "step_s": dt,
            "tokens_per_s": batch * seq / dt, "torch": torch.__version__}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    a = ap.parse_args()
    exe = os.path.join(a.build, "benchmarks", "bench_train_step")
    out = subprocess.run([exe, "--model", "small", "--seq", str(a.seq), "--batch", str(a.batch),
                          "--threads", str(a.threads), "--steps", str(a.steps)],
                         check=True, capture_output=True, text=True).stdout
    weft = json.loads(out.strip().splitlines()[-1])
    rows = [weft]
    for attn in ("eager", "sdpa"):
        rows.append(pytorch_step(a.threads, a.steps, a.seq, a.batch, attn))
    print(f"small Llama (6 layers, C=512), T={a.seq}, B={a.batch}, fp32, {a.threads} threads, "
          f"one step = forward + backward + AdamW")
    print(f"{'implementation':<24}{'step (s)':>10}{'tokens/s':>12}{'weft / it':>11}")
    for r in rows:
        print(f"{r['impl']:<24}{r['step_s']:>10.3f}{r['tokens_per_s']:>12.0f}"
              f"{weft['tokens_per_s'] / r['tokens_per_s']:>10.2f}x")


if __name__ == "__main__":
    sys.exit(main())
