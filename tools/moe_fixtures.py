#!/usr/bin/env python3
"""Write the Mixture-of-Experts Hugging Face folders weft is tested against.

transformers builds tiny randomly initialised MixtralForCausalLM,
Qwen3MoeForCausalLM and Llama4ForCausalLM (text) models, saves them with
`save_pretrained` (per-expert tensors, model.layers.{i}.block_sparse_moe.
experts.{e}.w1/w2/w3 and model.layers.{i}.mlp.experts.{e}.gate_proj/up_proj/
down_proj; Llama 4's fused model.layers.{i}.feed_forward.experts.
gate_up_proj (E, C, 2F) and down_proj (E, F, C), as the published
checkpoints hold them), and records its own fp32 loss, the logits of the
first window and its load-balancing loss on fixed tokens (Llama 4's model
computes none); weft must load each folder with --init and compute the
same. CI does not run this script; its
outputs are committed under tests/fixtures/hf_moe/. To regenerate:

    pip install torch transformers safetensors numpy
    python3 tools/moe_fixtures.py           # writes tests/fixtures/hf_moe/
    python3 tools/moe_fixtures.py --check   # regenerates in memory, compares

Folders
-------
mixtral/       V=64 C=16 L=3 H=4 H_kv=2 D=8, 4 experts of width 24, top-2,
               untied, fp32, one model.safetensors
mixtral_wide/  V=64 C=16 L=2 H=4 H_kv=4 D=8, 8 experts of width 12, top-3,
               untied, bf16, split by max_shard_size into several files
qwen3_moe/     V=64 C=16 L=3 H=4 H_kv=2 D=8, 4 experts of width 12, top-2
               without renormalisation (norm_topk_prob false), layer 1 dense
               (mlp_only_layers [1], intermediate_size 40), RMS norms of each
               head's q and k, untied, fp32
llama4/        V=64 C=16 L=4 H=4 H_kv=2 D=8, 4 experts of width 12 and a
               shared expert of width 12, sigmoid top-1 on the expert's
               input, MoE layers 1 and 3 (interleave_moe_layer_step 2; the
               dense ones of width 24), NoPE on layer 3 with the attention
               temperature (floor 4, scale 0.1: it changes inside the
               10-token window), the QK L2 norm on the RoPE layers, Meta's
               interleaved rotary pairs, attention chunk 16, untied, fp32
llama4_chunk/  llama4's config with attention chunk 4: the RoPE layers attend
               within positions 0-3, 4-7 and 8-9 of each 10-token window
               (two chunk boundaries), the NoPE layer over all of it
All: rope_theta 500000, rms_norm_eps 1e-3, router_aux_loss_coef 0.1.

Weights: drawn from one seeded torch.Generator in named_parameters() order
(transformers keeps the experts fused in memory: gate_up_proj (E, 2F, C),
down_proj (E, C, F)); matrices normal(0, 1/sqrt(in_features)), the router
normal(0, 2/sqrt(C)) so that its scores spread and the choices are far from
ties, the embedding normal(0, 0.5), the head normal(0, 2/sqrt(C)), RMSNorm
weights 1 + 0.2 normal(0, 1).

Tokens: W*T + 1 ids, uniform in [0, V), in tokens.npy (int32); window w is
tokens[w*T : w*T + T + 1].

reference.bin (tools/golden_llama.py's format, read by
tests/unit/golden/golden_file.h). For each folder F:
    F.loss      f32 ()      mean cross-entropy over the W*T targets, one
                            fp32 forward of all W windows (eager attention)
    F.loss_f64  f64 ()      the same in fp64
    F.aux       f32 ()      transformers' load_balancing_loss_func over that
                            forward's router logits (all W*T tokens of every
                            layer pooled), without the coefficient; NaN for
                            Llama 4, whose model has none
    F.logits0   f32 (T, V)  logits of window 0
    F.counts    i32 (L_moe, E) tokens each expert took in each MoE layer
                            (all k choices), from the router logits
and tokens (N,) i32. The header's "scalars" hold seq, windows, vocab and
each F.loss and F.aux (but a NaN).
"""

import argparse
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import (Llama4ForCausalLM, Llama4TextConfig, MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from golden_llama import publish_tree, serialize, tree_bytes  # noqa: E402  (same file format)

SEQ = 10
WINDOWS = 4
VOCAB = 64
ROPE_THETA = 500000.0
RMS_NORM_EPS = 1e-3
AUX_COEF = 0.1
DATA_SEED = 20261129

MODELS = {
    "mixtral": dict(config=dict(hidden_size=16, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2),
                    dtype=torch.float32, save={}, seed=20261130),
    "mixtral_wide": dict(config=dict(hidden_size=16, intermediate_size=12, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=4, head_dim=8,
                                     num_local_experts=8, num_experts_per_tok=3),
                         dtype=torch.bfloat16, save={"max_shard_size": "8KB"}, seed=20261131),
    "qwen3_moe": dict(family="qwen3_moe",
                      config=dict(hidden_size=16, intermediate_size=40, moe_intermediate_size=12,
                                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                  num_experts=4, num_experts_per_tok=2, norm_topk_prob=False,
                                  decoder_sparse_step=1, mlp_only_layers=[1]),
                      dtype=torch.float32, save={}, seed=20261132),
    "llama4": dict(family="llama4",
                   config=dict(hidden_size=16, intermediate_size=12, intermediate_size_mlp=24, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                               num_experts_per_tok=1, interleave_moe_layer_step=2, use_qk_norm=True,
                               attention_chunk_size=16, attn_temperature_tuning=True, floor_scale=4,
                               attn_scale=0.1),
                   dtype=torch.float32, save={}, seed=20261133),
}
# Llama 4 attending within chunks shorter than the window. Added after the
# others, so that their weights and reference values stay as they were.
MODELS["llama4_chunk"] = dict(MODELS["llama4"], config=dict(MODELS["llama4"]["config"], attention_chunk_size=4),
                              seed=20261134)

FAMILIES = {"mixtral": (MixtralConfig, MixtralForCausalLM), "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
            "llama4": (Llama4TextConfig, Llama4ForCausalLM)}


def experts_of(config) -> tuple[int, int]:
    """(E, k) of a config of either family."""
    E = getattr(config, "num_local_experts", None) or config.num_experts
    return E, config.num_experts_per_tok


def make_model(spec: dict):
    config_class, model_class = FAMILIES[spec.get("family", "mixtral")]
    extra = dict(router_jitter_noise=0.0) if config_class is MixtralConfig else {}
    if config_class is not Llama4TextConfig:
        extra["sliding_window"] = None
    config = config_class(
        **spec["config"], **extra, vocab_size=VOCAB, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA}, rms_norm_eps=RMS_NORM_EPS,
        router_aux_loss_coef=AUX_COEF, output_router_logits=True,
        max_position_embeddings=64, attention_dropout=0.0, attn_implementation="eager",
        experts_implementation="eager")
    model = model_class(config).float()
    g = torch.Generator().manual_seed(spec["seed"])
    C = config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * noise)
            elif name == "model.embed_tokens.weight":
                p.copy_(0.5 * noise)
            elif name == "lm_head.weight" or name.endswith(".gate.weight") or name.endswith(".router.weight"):
                p.copy_(2.0 / C ** 0.5 * noise)
            elif ".feed_forward.experts." in name:  # Llama 4's fused experts, (E, in, out)
                p.copy_(noise / p.shape[-2] ** 0.5)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)
    return model.eval()


def evaluate(model, inputs: torch.Tensor, targets: torch.Tensor) -> dict:
    E, k = experts_of(model.config)
    with torch.no_grad():
        out = model(input_ids=inputs, output_router_logits=True)
        logits = out.logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss64 = F.cross_entropy(model.double()(input_ids=inputs).logits.reshape(-1, logits.shape[-1]),
                                 targets.reshape(-1))
        model.float()
        # The balancing loss as transformers computes it, and written out
        # (Llama 4's model computes none: its top-k of the logits is the
        # top-k of their sigmoid).
        router = torch.stack([r.float() for r in out.router_logits])  # (L, W*T, E)
        llama4 = isinstance(model.config, Llama4TextConfig)
        probs = torch.sigmoid(router) if llama4 else torch.softmax(router, dim=-1)
        chosen = torch.topk(probs, k, dim=-1).indices
        counts = F.one_hot(chosen, E).sum(dim=-2).sum(dim=-2)  # (L, E)
        if llama4:
            aux = torch.tensor(float("nan"))
        else:
            pooled = probs.reshape(-1, E)
            mine = E * ((counts.sum(0).float() / pooled.shape[0]) * pooled.mean(0)).sum()
            aux = out.aux_loss.float()
            assert abs(mine.item() - aux.item()) <= 1e-6 * aux.item(), (mine.item(), aux.item())
        assert counts.sum().item() == router.shape[0] * router.shape[1] * k
    return dict(loss=loss, loss64=loss64, aux=aux, logits0=logits[0], counts=counts.to(torch.int32))


def generate(workdir: Path) -> tuple[dict, list]:
    g = torch.Generator().manual_seed(DATA_SEED)
    tokens = torch.randint(0, VOCAB, (WINDOWS * SEQ + 1,), generator=g).to(torch.int32).numpy()
    np.save(workdir / "tokens.npy", tokens)
    idx = np.arange(WINDOWS)[:, None] * SEQ + np.arange(SEQ)[None, :]
    inputs = torch.from_numpy(tokens[idx].astype(np.int64))
    targets = torch.from_numpy(tokens[idx + 1].astype(np.int64))
    tensors = [("tokens", tokens)]
    scalars = dict(seq=SEQ, windows=WINDOWS, vocab=VOCAB, aux_coef=AUX_COEF, data_seed=DATA_SEED)
    folders = {}
    for name, spec in MODELS.items():
        out = workdir / name
        make_model(spec).to(spec["dtype"]).save_pretrained(out, **spec["save"])
        # What weft loads: the saved weights, widened to fp32 as weft does.
        model_class = FAMILIES[spec.get("family", "mixtral")][1]
        loaded = model_class.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                             experts_implementation="eager").eval()
        r = evaluate(loaded, inputs, targets)
        tensors += [(f"{name}.loss", r["loss"].numpy()),
                    (f"{name}.loss_f64", np.array(r["loss64"].item(), dtype=np.float64)),
                    (f"{name}.aux", r["aux"].numpy()),
                    (f"{name}.logits0", r["logits0"].numpy()),
                    (f"{name}.counts", r["counts"].numpy())]
        if spec.get("family") == "qwen3_moe":
            assert loaded.config.norm_topk_prob is False and list(loaded.config.mlp_only_layers) == [1]
        if name == "llama4_chunk":  # the chunks are shorter than the window, and transformers masks by them
            assert loaded.config.attention_chunk_size < SEQ // 2, loaded.config.attention_chunk_size
            assert list(loaded.config.layer_types) == ["chunked_attention"] * 3 + ["full_attention"]
        if spec.get("family") == "llama4":  # NoPE on the last layer, MoE on 1 and 3
            assert list(loaded.config.no_rope_layers) == [1, 1, 1, 0], loaded.config.no_rope_layers
            assert list(loaded.config.moe_layers) == [1, 3], loaded.config.moe_layers
        scalars[f"{name}.loss"] = r["loss"].item()
        if not np.isnan(r["aux"].item()):  # JSON has no NaN
            scalars[f"{name}.aux"] = r["aux"].item()
        folders[name] = dict(dtype=str(spec["dtype"]).removeprefix("torch."), config=spec["config"],
                             files=sorted(p.name for p in out.iterdir()), seed=spec["seed"], **spec["save"])
    header = {
        "generator": {"script": "tools/moe_fixtures.py", "torch": torch.__version__,
                      "transformers": transformers.__version__, "python": platform.python_version(),
                      "attn_implementation": "eager", "experts_implementation": "eager"},
        "config": {"rope_theta": ROPE_THETA, "rms_norm_eps": RMS_NORM_EPS, "router_aux_loss_coef": AUX_COEF},
        "folders": folders,
        "scalars": scalars,
    }
    return header, tensors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", type=Path,
                    default=Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf_moe")
    ap.add_argument("--check", action="store_true", help="compare with the files in --out-dir instead of writing")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "hf_moe"
        work.mkdir()
        header, tensors = generate(work)
        (work / "reference.bin").write_bytes(serialize(header, tensors))
        new = tree_bytes(work)
        for k, v in header["scalars"].items():
            if k.endswith(".loss") or k.endswith(".aux"):
                print(f"{k}: {v:.6f}")
        print(f"{len(new)} files, {sum(len(b) for b in new.values())} bytes; torch {torch.__version__}, "
              f"transformers {transformers.__version__}")
        return publish_tree(work, args.out_dir, args.check)


if __name__ == "__main__":
    sys.exit(main())
