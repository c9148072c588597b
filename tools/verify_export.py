#!/usr/bin/env python3
"""Checks that `weft export` writes a Hugging Face model that transformers
loads and that computes the same logits as weft.

    python3 tools/verify_export.py --checkpoint runs/default/checkpoints/step_000300 [--weft build/weft]

It exports the checkpoint, asks `weft eval --dump` for the logits of the first
validation sample, runs the exported class (LlamaForCausalLM, or an MoE
model's MixtralForCausalLM, Qwen3MoeForCausalLM or Llama4ForCausalLM) on the
same tokens and prints the relative L2 and max abs difference. Exit 0 when the relative error
is below 1e-5 (both sides compute in fp32). Needs torch and transformers.
"""
import argparse, os, subprocess, sys, tempfile

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--weft", default="build/weft")
    ap.add_argument("--data", default="")
    a = ap.parse_args()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    with tempfile.TemporaryDirectory() as tmp:
        hf = os.path.join(tmp, "hf")
        subprocess.run([a.weft, "export", "--checkpoint", a.checkpoint, "--out", hf], check=True)
        ev = [a.weft, "eval", "--checkpoint", a.checkpoint, "--samples", "1", "--dump", tmp]
        if a.data:
            ev += ["--data", a.data]
        subprocess.run(ev, check=True)
        tokens = np.load(os.path.join(tmp, "tokens.npy"))
        ours = np.load(os.path.join(tmp, "logits.npy"))
        config = AutoConfig.from_pretrained(hf)
        # MoE classes: each expert computed on its own rows, as weft does.
        moe = {"experts_implementation": "eager"} if getattr(config, "num_local_experts", 0) else {}
        model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32, attn_implementation="eager", **moe)
        print(f"transformers' {type(model).__name__}")
        model.eval()
        with torch.no_grad():
            theirs = model(input_ids=torch.from_numpy(tokens.astype(np.int64))[None]).logits[0].numpy()
    rel = float(np.linalg.norm(ours - theirs) / np.linalg.norm(theirs))
    print(f"logits {ours.shape}: relative L2 error {rel:.3e}, max abs difference "
          f"{float(np.abs(ours - theirs).max()):.3e}")
    return 0 if rel < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
