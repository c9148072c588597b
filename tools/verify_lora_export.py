#!/usr/bin/env python3
"""Checks that a weft LoRA checkpoint exports as a PEFT adapter that the
`peft` package loads onto the transformers base and that computes weft's
logits, and that `weft export --merge` equals peft's merge_and_unload().

    python3 tools/verify_lora_export.py --checkpoint runs/lora/checkpoints/step_000100 [--weft build/weft] [--data DIR]

The base is the folder the checkpoint records (run.lora.base.path: a model
started with --init). It exports the adapters (--lora) and the merged model
(--merge), asks `weft eval --dump` for the logits of the first validation
sample, loads the base with transformers and the adapter with
peft.PeftModel.from_pretrained, and prints the relative L2 of the logits and
of the merged weights. Exit 0 when both are below 1e-5 (fp32 throughout).
Needs torch, transformers and peft.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def rel_l2(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--weft", default="build/weft")
    ap.add_argument("--data", default="")
    a = ap.parse_args()
    import torch
    from peft import PeftModel
    from safetensors.numpy import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    with open(os.path.join(a.checkpoint, "manifest.json")) as f:
        manifest = json.load(f)
    base_dir = manifest["run"]["lora"]["base"].get("path")
    if not base_dir:
        sys.exit("the checkpoint's base is a random initialisation (no --init): peft needs a base folder")
    with tempfile.TemporaryDirectory() as tmp:
        adapter, merged = os.path.join(tmp, "adapter"), os.path.join(tmp, "merged")
        subprocess.run([a.weft, "export", "--lora", "--checkpoint", a.checkpoint, "--out", adapter], check=True)
        subprocess.run([a.weft, "export", "--merge", "--checkpoint", a.checkpoint, "--out", merged], check=True)
        ev = [a.weft, "eval", "--checkpoint", a.checkpoint, "--samples", "1", "--dump", tmp]
        if a.data:
            ev += ["--data", a.data]
        subprocess.run(ev, check=True, stdout=subprocess.DEVNULL)
        tokens = np.load(os.path.join(tmp, "tokens.npy")).astype(np.int64)
        weft_logits = np.load(os.path.join(tmp, "logits.npy"))
        # The base's class (Llama, or an MoE family's, each expert on its own rows as weft computes them).
        moe = {"experts_implementation": "eager"} if getattr(AutoConfig.from_pretrained(base_dir),
                                                             "num_local_experts", 0) else {}
        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager", **moe)
        model = PeftModel.from_pretrained(base, adapter).eval()
        with torch.no_grad():
            logits = model(input_ids=torch.from_numpy(tokens)[None]).logits[0].float().numpy()
        e_logits = rel_l2(weft_logits[:, : logits.shape[1]], logits)
        want = model.merge_and_unload().state_dict()
        got = load_file(os.path.join(merged, "model.safetensors"))
        # An MoE class may hold its experts fused where the file names each
        # (Mixtral's block_sparse_moe.experts.{e}.w1/w3/w2, Qwen3-MoE's
        # mlp.experts.{e}.gate_proj/...): the file's are fused as the class
        # holds them, gate_up_proj (E, 2F, C) and down_proj (E, C, F), so the
        # experts' merged adapters are compared too.
        for name in [n for n in want if n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj")]:
            if name in got:
                continue
            layer = name.split(".")[2]
            E = want[name].shape[0]
            forms = [("block_sparse_moe.experts.{e}.w1", "block_sparse_moe.experts.{e}.w3",
                      "block_sparse_moe.experts.{e}.w2"),
                     ("mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj", "mlp.experts.{e}.down_proj")]
            for gate, up, down in forms:
                key = lambda f, e: f"model.layers.{layer}.{f.format(e=e)}.weight"
                if key(gate, 0) not in got:
                    continue
                if name.endswith("gate_up_proj"):
                    got[name] = np.stack([np.concatenate([got[key(gate, e)], got[key(up, e)]]) for e in range(E)])
                else:
                    got[name] = np.stack([got[key(down, e)] for e in range(E)])
        common = [n for n in got if n in want]
        if not any("self_attn" in n for n in common):
            sys.exit("the merged folder and merge_and_unload() share no attention tensor to compare")
        e_merge = max(rel_l2(got[n], want[n].numpy()) for n in common)
        experts = sum(1 for n in common if "experts" in n)
    print(f"logits: weft vs transformers+peft rel L2 {e_logits:.3e}")
    print(f"merged: weft export --merge vs merge_and_unload() worst rel L2 {e_merge:.3e} over {len(common)} tensors "
          f"({experts} of them routed experts')")
    ok = e_logits < 1e-5 and e_merge < 1e-5
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
