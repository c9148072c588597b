#!/usr/bin/env python3
"""Write the PyTorch reference ("golden") fixtures for weft's Llama model.

First link of the reference chain (docs: STYLE.md): PyTorch + Hugging Face
`transformers` compute a tiny LlamaForCausalLM in fp32 on the CPU, this script
writes the results to tests/fixtures/, and weft's CPU path must match them.
CI does not run this script; the fixtures are committed. To regenerate:

    pip install torch transformers safetensors numpy
    python3 tools/golden_llama.py            # writes tests/fixtures/golden_llama_*.bin
    python3 tools/golden_llama.py --check    # regenerates in memory, compares bytes

Fixtures
--------
golden_llama_gqa.bin   V=67 C=32 F=88 L=2 H=4 H_kv=2 D=8, untied lm_head
golden_llama_tied.bin  V=67 C=32 F=88 L=3 H=4 H_kv=4 D=8, tied embeddings
Both: rope_theta 10000, rms_norm_eps 1e-5, no biases, B=2, T=7.

Weights: normal(0, 0.02) for every 2-D weight, 1 + 0.1 * normal(0, 1) for the
RMSNorm weights, drawn in `named_parameters()` order from one seeded
torch.Generator. Tokens: a (B, T+1) uniform draw in [0, V) from a second
generator; inputs = tokens[:, :T], targets = tokens[:, 1:]. The loss is the
mean cross-entropy over all B*T targets, computed here from the logits (no
Hugging Face label shifting involved).

Optimizer run: 5 steps on the same batch. Each step: forward, loss, backward,
total = clip_grad_norm_(all params, max_norm=1.0) (pre-clip norm recorded;
grads are scaled by min(1, max_norm / (total + 1e-6))), then
torch.optim.AdamW(betas=(0.9, 0.95), eps=1e-8) with two groups: 2-D weights
decay with 0.1, RMSNorm weights do not. lr at 1-based step s is
1e-2 * min(s, 2) / 2 (linear warm-up from lr/2 over 2 steps, then constant).

Tensors (all little-endian; "P" ranges over the parameter names in Hugging
Face order: model.embed_tokens.weight, model.layers.{i}.self_attn.{q,k,v,o}_proj
.weight, model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.layers.{i}
.{input,post_attention}_layernorm.weight, model.norm.weight, lm_head.weight
when untied):
    P               f32  initial parameter
    inputs          i32  (B, T)
    targets         i32  (B, T)
    logits          f32  (B, T, V) with the initial parameters
    loss            f32  ()  mean cross-entropy of logits vs targets
    grad.P          f32  d loss / d P, before clipping
    step_losses     f32  (5,) loss before each update; step_losses[0] == loss
    grad_norms      f32  (5,) global L2 grad norm before clipping
    clip_coefs      f32  (5,) min(1, max_norm / (norm + 1e-6)) applied to grads
    lrs             f64  (5,) lr used at each step
    final.P         f32  parameter after the 5 updates
    final_loss      f32  ()  loss with the final parameters

File format, version 1
----------------------
    offset 0   8 bytes    magic "WEFTGLD1"
    offset 8   uint32 LE  format version (1)
    offset 12  uint32 LE  header length N in bytes
    offset 16  N bytes    UTF-8 JSON header, padded with spaces so that the
                          data section starts at a multiple of 8
    16 + N     data section: tensors stored contiguously, row-major
The header is an object with keys
    "generator": {"script", "torch", "transformers", "python", ...}
    "config":    LlamaConfig fields weft needs (vocab_size, hidden_size,
                 intermediate_size, num_hidden_layers, num_attention_heads,
                 num_key_value_heads, head_dim, rope_theta, rms_norm_eps,
                 tie_word_embeddings, plus hidden_act, biases, rope_type, ...)
    "optimizer": AdamW, clipping and schedule settings, group membership
    "scalars":   batch, seq_len, seeds, num_steps, and loss / final_loss as
                 JSON numbers (exact copies of the f32 tensors)
    "tensors":   {name: {"dtype": "f32"|"i32"|"f64", "shape": [...],
                         "offset": bytes from the start of the data section
                                   (a multiple of 8), "nbytes": ...}}
The C++ reader is tests/unit/golden/golden_file.{h,cpp}.

The output is deterministic: one thread, deterministic algorithms, fixed
seeds, JSON written in a fixed key order.
"""

import argparse
import json
import os
import platform
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

MAGIC = b"WEFTGLD1"
FORMAT_VERSION = 1
ALIGN = 8

BATCH = 2
SEQ_LEN = 7  # odd on purpose
NUM_STEPS = 5

LR = 1e-2
BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.1
MAX_GRAD_NORM = 1.0
WARMUP_STEPS = 2

FIXTURES = {
    "golden_llama_gqa.bin": dict(
        model=dict(vocab_size=67, hidden_size=32, intermediate_size=88,
                   num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8,
                   tie_word_embeddings=False),
        weight_seed=20240601, data_seed=20240602),
    "golden_llama_tied.bin": dict(
        model=dict(vocab_size=67, hidden_size=32, intermediate_size=88,
                   num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=4, head_dim=8,
                   tie_word_embeddings=True),
        weight_seed=20240611, data_seed=20240612),
}

ROPE_THETA = 10000.0
RMS_NORM_EPS = 1e-5
MAX_POSITIONS = 64


def make_config(model: dict, attn_implementation: str) -> LlamaConfig:
    return LlamaConfig(
        **model,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        rms_norm_eps=RMS_NORM_EPS,
        max_position_embeddings=MAX_POSITIONS,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        pad_token_id=None,  # a padding_idx would zero that row's embedding grad
        attn_implementation=attn_implementation,
    )


def init_weights(model: LlamaForCausalLM, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if p.dim() == 1:  # RMSNorm weights: near one but not all ones
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.02 * noise)


def mean_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    v = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, v), targets.reshape(-1).long(),
                           reduction="mean")


def lr_at(step: int) -> float:
    """1-based step: linear warm-up from LR/WARMUP_STEPS to LR, then constant."""
    return LR * min(step, WARMUP_STEPS) / WARMUP_STEPS


def sanity_checks(model, config_kw, tokens, inputs, targets, logits, loss):
    """Cross-checks that the stored loss is what Hugging Face would report."""
    with torch.no_grad():
        # HF loss with explicit shift_labels: same logits, so the same value.
        out = model(input_ids=inputs, labels=inputs, shift_labels=targets.long())
        assert torch.equal(out.logits, logits), "forward is not repeatable"
        assert abs(out.loss.item() - loss.item()) <= 1e-6 * loss.item(), \
            (out.loss.item(), loss.item())
        # HF's own shifting on the (B, T+1) draw: T targets per row, the same
        # ones; logits equal up to rounding since the GEMM shapes differ.
        out = model(input_ids=tokens, labels=tokens)
        assert abs(out.loss.item() - loss.item()) <= 1e-5 * loss.item(), \
            (out.loss.item(), loss.item())
        # fp64 cross-entropy of the stored logits.
        l64 = F.cross_entropy(logits.double().reshape(-1, logits.shape[-1]),
                              targets.reshape(-1).long()).item()
        assert abs(l64 - loss.item()) <= 1e-6 * l64, (l64, loss.item())
        # SDPA attention instead of eager: same math, different rounding.
        sdpa = LlamaForCausalLM(make_config(config_kw, "sdpa"))
        sdpa.load_state_dict(model.state_dict())
        d = (sdpa(input_ids=inputs).logits - logits).abs().max().item()
        assert d < 1e-5, d
    return l64, d


def generate(spec: dict) -> tuple[dict, list]:
    """Returns (header, [(name, np.ndarray)]) for one fixture."""
    config = make_config(spec["model"], "eager")
    model = LlamaForCausalLM(config).float()
    init_weights(model, spec["weight_seed"])
    model.train()  # dropout is 0; train() only to mirror training
    if config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight

    named = list(model.named_parameters())  # tied lm_head appears once
    params = [p for _, p in named]
    V = config.vocab_size

    g = torch.Generator().manual_seed(spec["data_seed"])
    tokens = torch.randint(0, V, (BATCH, SEQ_LEN + 1), generator=g)
    inputs = tokens[:, :SEQ_LEN].contiguous()  # (B, T)
    targets = tokens[:, 1:].contiguous()  # (B, T)

    initial = {n: p.detach().clone() for n, p in named}
    decay = [n for n, p in named if p.dim() == 2]
    no_decay = [n for n, p in named if p.dim() != 2]
    by_name = dict(named)
    opt = torch.optim.AdamW(
        [{"params": [by_name[n] for n in decay], "weight_decay": WEIGHT_DECAY},
         {"params": [by_name[n] for n in no_decay], "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=ADAM_EPS, weight_decay=WEIGHT_DECAY,
        foreach=False, fused=False)

    step_losses, grad_norms, clip_coefs, lrs = [], [], [], []
    logits0 = loss0 = grads0 = None
    for step in range(1, NUM_STEPS + 1):
        lr = lr_at(step)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=inputs).logits  # (B, T, V)
        loss = mean_cross_entropy(logits, targets)
        loss.backward()
        if step == 1:
            logits0, loss0 = logits.detach().clone(), loss.detach().clone()
            grads0 = {n: p.grad.detach().clone() for n, p in named}
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=MAX_GRAD_NORM)
        coef = torch.clamp(MAX_GRAD_NORM / (norm + 1e-6), max=1.0)
        opt.step()
        step_losses.append(loss.item())
        grad_norms.append(norm.item())
        clip_coefs.append(coef.item())
        lrs.append(lr)

    with torch.no_grad():
        final_loss = mean_cross_entropy(model(input_ids=inputs).logits, targets)
    final = {n: p.detach().clone() for n, p in named}

    # Sanity checks run on a fresh model holding the initial weights.
    check = LlamaForCausalLM(config).float()
    with torch.no_grad():
        for n, p in check.named_parameters():
            p.copy_(initial[n])
    loss_f64, sdpa_diff = sanity_checks(check, spec["model"], tokens, inputs,
                                        targets, logits0, loss0)
    assert step_losses[0] == loss0.item()

    tensors = []
    for n in initial:
        tensors.append((n, initial[n].numpy()))
    tensors.append(("inputs", inputs.to(torch.int32).numpy()))
    tensors.append(("targets", targets.to(torch.int32).numpy()))
    tensors.append(("logits", logits0.numpy()))
    tensors.append(("loss", loss0.numpy()))
    for n in grads0:
        tensors.append(("grad." + n, grads0[n].numpy()))
    tensors.append(("step_losses", np.array(step_losses, dtype=np.float32)))
    tensors.append(("grad_norms", np.array(grad_norms, dtype=np.float32)))
    tensors.append(("clip_coefs", np.array(clip_coefs, dtype=np.float32)))
    tensors.append(("lrs", np.array(lrs, dtype=np.float64)))
    for n in final:
        tensors.append(("final." + n, final[n].numpy()))
    tensors.append(("final_loss", final_loss.numpy()))

    header = {
        "generator": {
            "script": "tools/golden_llama.py",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "attn_implementation": "eager",
            "num_threads": torch.get_num_threads(),
            "sdpa_vs_eager_max_abs_logit_diff": sdpa_diff,
        },
        "config": {
            "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size,
            "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
            "head_dim": config.head_dim,
            "rope_theta": config.rope_parameters["rope_theta"],
            "rope_type": config.rope_parameters["rope_type"],
            "rms_norm_eps": config.rms_norm_eps,
            "tie_word_embeddings": config.tie_word_embeddings,
            "hidden_act": config.hidden_act,
            "attention_bias": config.attention_bias,
            "mlp_bias": config.mlp_bias,
            "max_position_embeddings": config.max_position_embeddings,
        },
        "optimizer": {
            "type": "AdamW",
            "implementation": "torch.optim.AdamW(foreach=False, fused=False)",
            "lr": LR,
            "beta1": BETAS[0],
            "beta2": BETAS[1],
            "eps": ADAM_EPS,
            "weight_decay": WEIGHT_DECAY,
            "weight_decay_params": decay,
            "no_weight_decay_params": no_decay,
            "max_grad_norm": MAX_GRAD_NORM,
            "clip_formula": "grad *= min(1, max_norm / (total_norm + 1e-6))",
            "schedule": "lr * min(step, warmup_steps) / warmup_steps, step 1-based",
            "warmup_steps": WARMUP_STEPS,
            "num_steps": NUM_STEPS,
        },
        "scalars": {
            "batch": BATCH,
            "seq_len": SEQ_LEN,
            "weight_seed": spec["weight_seed"],
            "data_seed": spec["data_seed"],
            "num_steps": NUM_STEPS,
            "num_params": len(named),
            "loss": loss0.item(),
            "loss_f64_from_logits": loss_f64,
            "final_loss": final_loss.item(),
        },
    }
    return header, tensors


DTYPES = {np.dtype(np.float32): ("f32", "<f4"),
          np.dtype(np.int32): ("i32", "<i4"),
          np.dtype(np.float64): ("f64", "<f8")}


def serialize(header: dict, tensors: list) -> bytes:
    index, chunks, offset = {}, [], 0
    for name, arr in tensors:
        assert name not in index, name
        code, le = DTYPES[arr.dtype]
        data = np.ascontiguousarray(arr).astype(le, copy=False).tobytes()
        index[name] = {"dtype": code, "shape": list(arr.shape),
                       "offset": offset, "nbytes": len(data)}
        pad = (-len(data)) % ALIGN
        chunks.append(data + b"\0" * pad)
        offset += len(data) + pad
    header = dict(header, tensors=index)
    text = json.dumps(header, indent=1, ensure_ascii=False).encode("utf-8")
    text += b" " * ((-(16 + len(text))) % ALIGN)
    return MAGIC + struct.pack("<II", FORMAT_VERSION, len(text)) + text + b"".join(chunks)


def tree_bytes(root: Path) -> dict:
    """Every file under `root`, by its path relative to it, as bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def publish_tree(work: Path, out_dir: Path, check: bool) -> int:
    """A folder of fixtures generated in `work`: with `check`, compared with
    `out_dir` file by file (each differing one printed; 1 when any differ);
    else `out_dir` replaced by it. The exit status."""
    if check:
        new = tree_bytes(work)
        old = tree_bytes(out_dir) if out_dir.exists() else {}
        differ = sorted(k for k in new.keys() | old.keys() if new.get(k) != old.get(k))
        for k in differ:
            print(f"  DIFFERS: {k}")
        return 1 if differ else 0
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(work, out_dir)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", type=Path,
                    default=Path(__file__).resolve().parent.parent / "tests" / "fixtures")
    ap.add_argument("--check", action="store_true",
                    help="compare with the files in --out-dir instead of writing")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    status = 0
    for fname, spec in FIXTURES.items():
        header, tensors = generate(spec)
        blob = serialize(header, tensors)
        path = args.out_dir / fname
        s = header["scalars"]
        print(f"{fname}: {len(blob)} bytes, loss {s['loss']:.6f}, "
              f"final_loss {s['final_loss']:.6f}, "
              f"sdpa-eager {header['generator']['sdpa_vs_eager_max_abs_logit_diff']:.2e}")
        if args.check:
            same = path.exists() and path.read_bytes() == blob
            print(f"  {'same bytes as' if same else 'DIFFERS from'} {path}")
            status |= 0 if same else 1
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(blob)
            os.replace(tmp, path)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    return status


if __name__ == "__main__":
    sys.exit(main())
