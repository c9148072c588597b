#!/usr/bin/env python3
"""Write the Hugging Face model folders that `weft train --init` is tested on.

First link of the reference chain for pretrained starts (docs: STYLE.md):
transformers builds tiny randomly initialised LlamaForCausalLM models, saves
them with `save_pretrained` exactly as a user's download would look, and
records its own fp32 loss on fixed tokens; weft must load each folder and
compute the same loss. CI does not run this script; its outputs are committed
under tests/fixtures/hf_init/. To regenerate:

    pip install torch transformers safetensors numpy
    python3 tools/hf_init_fixtures.py           # writes tests/fixtures/hf_init/
    python3 tools/hf_init_fixtures.py --check   # regenerates in memory, compares

Folders (config.json, generation_config.json and the weights save_pretrained
writes)
-------
untied/        V=64 C=16 F=40 L=4 H=4 H_kv=2 D=8 (H*D != C), untied lm_head,
               fp32, one model.safetensors
untied_bf16/   the same model cast to bf16 (torch rounds to nearest even)
untied_fp16/   the same model cast to fp16
tied_sharded/  V=64 C=16 F=40 L=2 H=4 H_kv=4 D=8, tie_word_embeddings (no
               lm_head tensor), fp32, split by max_shard_size into several
               model-0000k-of-0000n.safetensors with model.safetensors.index.json
rope_llama3/   V=64 C=16 F=40 L=4 H=4 H_kv=2 D=16, untied, fp32, with Llama 3's
               RoPE scaling (rope_type "llama3": factor 8, low_freq_factor 2,
               high_freq_factor 8, original_max_position_embeddings 128;
               max_position_embeddings 1024). Its 8 pairs' wavelengths
               6.3 | 32 | 167, 860, ... put pair 0 in the kept band (< 128/8),
               pair 1 in the interpolated one and pairs 2-7 in the slowed one
               (> 128/2), and pair 1 turns by up to 2 radians over T=12, so the
               scaling moves the loss by far more than the test's tolerance.
All: rope_theta 500000 (stored by transformers 5 under rope_parameters) and
rms_norm_eps 1e-3, values away from the defaults so that a misread field
changes the loss.

Weights: drawn from one seeded torch.Generator in
named_parameters() order. Linear weights normal(0, 1/sqrt(in_features)), the
embedding normal(0, 1), the untied lm_head normal(0, 2/sqrt(C)), RMSNorm
weights 1 + 0.2 * normal(0, 1). Logits then spread over several nats, so the
loss depends on every weight being in its place (a near-uniform model's loss
would be log V whatever the weights).

Tokens: N = W*T + 1 ids, uniform in [0, V), in tokens.npy (int32), which weft
reads as a token file. weft's loader cuts them into W windows of T + 1 tokens
(window w = tokens[w*T : w*T + T + 1]); a global batch of W sequences at
--seq T therefore covers every window once, in some order.

reference.bin (tools/golden_llama.py's format, read by
tests/unit/golden/golden_file.h). Tensors, for each folder F:
    F.loss          f32 ()      mean cross-entropy over the W*T targets,
                                transformers fp32 forward (eager attention)
                                of the folder's weights widened to fp32
    F.loss_f64      f64 ()      the same in fp64 (model.double())
    F.logits0       f32 (T, V)  logits of window 0, fp32
    F.loss_vocab72  f32 ()      the loss after padding the vocabulary to 72
                                rows the way weft does (embedding and head
                                rows 64..71 set to the mean of rows 0..63)
    F.loss_plain_rope f32 ()    (scaled folders only) the loss of the same
                                weights with rope_type "default": how far
                                the scaling moves it
and tokens (N,) i32. The header's "scalars" hold seq, windows, vocab,
padded_vocab and each F.loss as a JSON number; "folders" holds each folder's
config and weight files.
"""

import argparse
import copy
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from golden_llama import publish_tree, serialize, tree_bytes  # noqa: E402  (same file format)

SEQ = 12  # T, not a power of two on purpose
WINDOWS = 6  # W
VOCAB = 64
PADDED_VOCAB = 72
ROPE_THETA = 500000.0
RMS_NORM_EPS = 1e-3
DATA_SEED = 20250301

MODELS = {
    "untied": dict(
        config=dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=40,
                    num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8,
                    tie_word_embeddings=False),
        seed=20250302),
    "tied": dict(
        config=dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=40,
                    num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=4, head_dim=8,
                    tie_word_embeddings=True),
        seed=20250303),
    "rope_llama3": dict(
        config=dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=40,
                    num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16,
                    tie_word_embeddings=False),
        rope=dict(rope_type="llama3", factor=8.0, low_freq_factor=2.0,
                  high_freq_factor=8.0, original_max_position_embeddings=128),
        max_position_embeddings=1024,
        seed=20250304),
}

# Folder name -> (model, dtype of the saved weights, save_pretrained kwargs).
FOLDERS = {
    "untied": ("untied", torch.float32, {}),
    "untied_bf16": ("untied", torch.bfloat16, {}),
    "untied_fp16": ("untied", torch.float16, {}),
    "tied_sharded": ("tied", torch.float32, {"max_shard_size": "12KB"}),
    "rope_llama3": ("rope_llama3", torch.float32, {}),
}


def make_model(spec: dict, rope: dict | None = None) -> LlamaForCausalLM:
    """The model of `spec`, with `rope` in place of its RoPE settings if given."""
    rope = rope if rope is not None else spec.get("rope", {"rope_type": "default"})
    config = LlamaConfig(
        **spec["config"],
        rope_parameters={**rope, "rope_theta": ROPE_THETA},
        rms_norm_eps=RMS_NORM_EPS,
        max_position_embeddings=spec.get("max_position_embeddings", 64),
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        pad_token_id=None,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config).float()
    g = torch.Generator().manual_seed(spec["seed"])
    C = config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * noise)
            elif name == "model.embed_tokens.weight":
                p.copy_(0.5 * noise)
            elif name == "lm_head.weight":
                p.copy_(2.0 / C ** 0.5 * noise)
            else:
                p.copy_(noise / p.shape[1] ** 0.5)
    model.eval()
    if config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


def windows(tokens: np.ndarray):
    idx = np.arange(WINDOWS)[:, None] * SEQ + np.arange(SEQ)[None, :]
    inputs = torch.from_numpy(tokens[idx].astype(np.int64))  # (W, T)
    targets = torch.from_numpy(tokens[idx + 1].astype(np.int64))  # (W, T)
    return inputs, targets


def mean_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           reduction="mean")


def pad_vocab(model: LlamaForCausalLM, rows: int) -> LlamaForCausalLM:
    """weft's rule for --vocab larger than the checkpoint's: every new row of
    the embedding and of the head is the mean of the pretrained rows."""
    config = LlamaConfig.from_dict(model.config.to_dict())
    config.vocab_size = rows
    padded = LlamaForCausalLM(config).float().eval()
    state = {}
    for name, t in model.state_dict().items():
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            t = torch.cat([t, t.double().mean(0, keepdim=True).float().expand(rows - t.shape[0], -1)])
        state[name] = t
    padded.load_state_dict(state, strict=not config.tie_word_embeddings)
    if config.tie_word_embeddings:
        padded.tie_weights()
    return padded


def evaluate(model: LlamaForCausalLM, inputs, targets) -> dict:
    with torch.no_grad():
        logits = model(input_ids=inputs).logits.float()
        loss = mean_loss(logits, targets)
        loss64 = mean_loss(model.double()(input_ids=inputs).logits, targets)
        model.float()
        # Hugging Face's own labels path agrees (it shifts labels itself).
        hf = model(input_ids=inputs, labels=inputs, shift_labels=targets).loss
        assert abs(hf.item() - loss.item()) <= 1e-6 * loss.item(), (hf.item(), loss.item())
    return dict(loss=loss, loss64=loss64, logits0=logits[0])


def generate(workdir: Path) -> tuple[dict, list]:
    g = torch.Generator().manual_seed(DATA_SEED)
    tokens = torch.randint(0, VOCAB, (WINDOWS * SEQ + 1,), generator=g).to(torch.int32).numpy()
    np.save(workdir / "tokens.npy", tokens)
    inputs, targets = windows(tokens)

    models = {name: make_model(spec) for name, spec in MODELS.items()}
    tensors = [("tokens", tokens)]
    scalars = dict(seq=SEQ, windows=WINDOWS, vocab=VOCAB, padded_vocab=PADDED_VOCAB,
                   data_seed=DATA_SEED)
    folders = {}
    for folder, (name, dtype, kwargs) in FOLDERS.items():
        model = models[name]
        out = workdir / folder
        copy.deepcopy(model).to(dtype).save_pretrained(out, **kwargs)
        # What weft loads: the saved weights, widened to fp32 as weft does.
        loaded = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
        r = evaluate(loaded, inputs, targets)
        padded = evaluate(pad_vocab(loaded, PADDED_VOCAB), inputs, targets)
        tensors += [(f"{folder}.loss", r["loss"].numpy()),
                    (f"{folder}.loss_f64", np.array(r["loss64"].item(), dtype=np.float64)),
                    (f"{folder}.logits0", r["logits0"].numpy()),
                    (f"{folder}.loss_vocab{PADDED_VOCAB}", padded["loss"].numpy())]
        scalars[f"{folder}.loss"] = r["loss"].item()
        scalars[f"{folder}.loss_vocab{PADDED_VOCAB}"] = padded["loss"].item()
        folders[folder] = dict(model=name, dtype=str(dtype).removeprefix("torch."),
                               files=sorted(p.name for p in out.iterdir()), **kwargs,
                               config=MODELS[name]["config"], seed=MODELS[name]["seed"])
        if "rope" in MODELS[name]:
            # The loaded config keeps the scaling as written.
            assert loaded.config.rope_parameters["rope_type"] == MODELS[name]["rope"]["rope_type"]
            plain = make_model(MODELS[name], rope={"rope_type": "default"})
            plain.load_state_dict(loaded.state_dict())
            p = evaluate(plain, inputs, targets)
            tensors.append((f"{folder}.loss_plain_rope", p["loss"].numpy()))
            scalars[f"{folder}.loss_plain_rope"] = p["loss"].item()
            folders[folder]["rope_parameters"] = MODELS[name]["rope"]
    header = {
        "generator": {
            "script": "tools/hf_init_fixtures.py",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "attn_implementation": "eager",
        },
        "config": {"rope_theta": ROPE_THETA, "rms_norm_eps": RMS_NORM_EPS},
        "folders": folders,
        "scalars": scalars,
    }
    return header, tensors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", type=Path,
                    default=Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf_init")
    ap.add_argument("--check", action="store_true",
                    help="compare with the files in --out-dir instead of writing")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "hf_init"
        work.mkdir()
        header, tensors = generate(work)
        (work / "reference.bin").write_bytes(serialize(header, tensors))
        new = tree_bytes(work)
        total = sum(len(b) for b in new.values())
        for k, v in header["scalars"].items():
            if k.endswith("loss") or k.endswith("loss_plain_rope"):
                print(f"{k}: {v:.6f}")
        print(f"{len(new)} files, {total} bytes; torch {torch.__version__}, "
              f"transformers {transformers.__version__}")
        return publish_tree(work, args.out_dir, args.check)


if __name__ == "__main__":
    sys.exit(main())
