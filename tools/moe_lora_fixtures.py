#!/usr/bin/env python3
"""Write the fixtures for LoRA on Mixture-of-Experts models against `peft`.

A link of the reference chain (docs: STYLE.md): Hugging Face `transformers`
loads three tiny MoE models (tests/fixtures/hf_moe/'s mixtral and llama4,
written by tools/moe_fixtures.py, llama4 with a shared expert and dense
layers; and hf_moe's qwen3_moe config without its dense layer, drawn and
saved here as qwen3_moe/base/), `peft` puts LoRA adapters on every linear
layer and on the routed experts' 3-D tensors (target_parameters
experts.gate_up_proj and experts.down_proj), saves them with
`save_pretrained` exactly as a user's adapter folder looks, and records in
fp64 the loss, the logits of window 0 and the gradient of every adapter
tensor as PEFT stores it (the experts' packed). weft must load each folder
with --init and --lora-init and reproduce them. CI does not run this
script; its outputs are committed under tests/fixtures/hf_moe_lora/. To
regenerate:

    pip install torch transformers peft safetensors numpy
    python3 tools/moe_lora_fixtures.py           # writes tests/fixtures/hf_moe_lora/
    python3 tools/moe_lora_fixtures.py --check   # regenerates in memory, compares

Adapters
--------
LoraConfig(r=2, lora_alpha=3, lora_dropout=0, bias="none",
target_modules=the attention's q_proj, k_proj, v_proj, o_proj and, where the
model has such modules (qwen3_moe's dense layer; llama4's dense layers and
shared expert), gate_proj, up_proj, down_proj; target_parameters=
["experts.gate_up_proj", "experts.down_proj"]): scaling 1.5. Every adapter
tensor is drawn (one torch.Generator seeded per folder, named_parameters()
order) normal(0, 1) / sqrt(in) for lora_A and 0.5 normal(0, 1) / sqrt(r E)
for lora_B, so that the adapters change the model and A gets gradients.
The script asserts PEFT's packing of the experts' adapters against the
rule peft.h states (lora_A (r E, in) expert-major, lora_B (out, r E)
rank-major; Llama 4's experts stored (E, in, out)), via get_delta_weight.

Objective: the mean cross-entropy over the W*T targets of one fp64 forward
of the W windows (eager attention and experts), without the balancing loss
(Llama 4's model computes none; weft's run sets its coefficient to 0).

qwen3_moe_usual/ holds the adapter PEFT makes of a user's usual config on
that Qwen3-MoE (every linear layer in target_modules, no
target_parameters): PEFT takes gate_proj, up_proj and down_proj for the
experts' transformers-v4 names, fuses them and gives the experts'
gate_up_proj twice the rank and alpha (rank_pattern, alpha_pattern), which
weft reads as --lora-gate-up-rank 4.

reference.bin (tools/golden_llama.py's format). For each folder F:
    F.loss      f64 ()      the objective
    F.logits0   f64 (T, V)  logits of window 0
    F.grad.<n>  f64 (...)   the gradient of adapter tensor n, PEFT's name
                            (base_model.model....lora_A.weight), PEFT's shape
The header lists each folder's tensor names and the adapter config; the
tokens are hf_moe's (tests/fixtures/hf_moe/tokens.npy).
"""

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import peft
import torch
import torch.nn.functional as F
import transformers
from peft import LoraConfig, get_peft_model
from transformers import Llama4ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe_fixtures  # noqa: E402  (its models' shapes and weight draws)
from golden_llama import publish_tree, serialize, tree_bytes  # noqa: E402  (same file format)

ROOT = Path(__file__).resolve().parent.parent
BASES = ROOT / "tests" / "fixtures" / "hf_moe"
SEQ = 10
WINDOWS = 4
RANK = 2
ALPHA = 3
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL = ATTENTION + ["gate_proj", "up_proj", "down_proj"]
# name: (class, target_modules, seed, base folder). Mixtral and Qwen3-MoE
# have no FFN modules outside their routed experts (qwen3_moe's base here is
# hf_moe's config without its dense layer, written by this script: PEFT
# takes a Qwen3-MoE's gate_proj, up_proj and down_proj for the experts'
# transformers-v4 names, so it can adapt no dense layer's), so their
# target_modules are the attention's; Llama 4's name its dense layers' and
# shared expert's too.
EXPERTS = ["experts.gate_up_proj", "experts.down_proj"]
FOLDERS = {
    "mixtral": (MixtralForCausalLM, ATTENTION, EXPERTS, 20261201, "hf_moe/mixtral"),
    "qwen3_moe": (Qwen3MoeForCausalLM, ATTENTION, EXPERTS, 20261202, "hf_moe_lora/qwen3_moe/base"),
    "llama4": (Llama4ForCausalLM, ALL, EXPERTS, 20261203, "hf_moe/llama4"),
    # A user's usual config, every linear layer in target_modules and no
    # target_parameters: PEFT takes a Qwen3-MoE's gate_proj, up_proj and
    # down_proj for its experts' transformers-v4 names, fuses them into
    # target_parameters and gives the experts' gate_up_proj twice the rank
    # and alpha (rank_pattern, alpha_pattern): weft's --lora-gate-up-rank.
    "qwen3_moe_usual": (Qwen3MoeForCausalLM, ALL, None, 20261204, "hf_moe_lora/qwen3_moe/base"),
}


def sort_lists(cfg: dict) -> None:
    """PEFT keeps its targets in sets: their order in the saved lists follows string hashing, which differs
    from run to run; sorted, the file is the same every time (PEFT reads them back as sets)."""
    for key in ("target_modules", "target_parameters"):
        if isinstance(cfg.get(key), list):
            cfg[key] = sorted(cfg[key])


def check_packing(model, name: str) -> int:
    """Each expert wrapper's delta from get_delta_weight against peft.h's rule."""
    checked = 0
    for mod_name, module in model.named_modules():
        if type(module).__name__ != "ParamWrapper":
            continue
        A = module.lora_A["default"].weight.detach()  # (r E, n_a)
        B = module.lora_B["default"].weight.detach()  # (n_b, r E)
        E = module.num_experts
        r = A.shape[0] // E
        s = module.scaling["default"]
        delta = module.get_delta_weight("default")  # the stored tensor's shape
        for e in range(E):
            Ae = A[e * r:(e + 1) * r]  # (r, n_a): expert-major rows
            Be = B[:, [j * E + e for j in range(r)]]  # (n_b, r): rank-major columns
            want = s * (Be @ Ae)
            assert torch.allclose(delta[e], want, rtol=1e-12, atol=1e-14), (name, mod_name, e)
        checked += 1
    assert checked > 0, name
    return checked


def generate(workdir: Path) -> tuple[dict, list]:
    tokens = np.load(BASES / "tokens.npy")
    idx = np.arange(WINDOWS)[:, None] * SEQ + np.arange(SEQ)[None, :]
    inputs = torch.from_numpy(tokens[idx].astype(np.int64))
    targets = torch.from_numpy(tokens[idx + 1].astype(np.int64))
    tensors = []
    folders = {}
    for name, (model_class, modules, params, seed, base_dir) in FOLDERS.items():
        source = BASES.parent / base_dir if base_dir.startswith("hf_moe/") else workdir / "qwen3_moe" / "base"
        if not source.exists():  # written here: hf_moe's qwen3_moe without its dense layer
            spec = dict(moe_fixtures.MODELS["qwen3_moe"], seed=20261302)
            spec["config"] = dict(spec["config"], mlp_only_layers=[])
            moe_fixtures.make_model(spec).save_pretrained(source)
        base = model_class.from_pretrained(source, dtype=torch.float64, attn_implementation="eager",
                                           experts_implementation="eager").eval()
        extra = dict(target_parameters=params) if params else {}
        config = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, bias="none", target_modules=modules, **extra)
        model = get_peft_model(base, config)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "lora_" not in pname:
                    continue
                noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
                p.copy_(noise / p.shape[1] ** 0.5 if "lora_A" in pname else 0.5 * noise / p.shape[1] ** 0.5)
        wrappers = check_packing(model, name)
        out = workdir / name / "adapter"
        model.save_pretrained(out, safe_serialization=True)
        (out / "README.md").unlink(missing_ok=True)
        cfg = json.loads((out / "adapter_config.json").read_text())
        sort_lists(cfg)
        cfg["base_model_name_or_path"] = f"../../../{base_dir}" if base_dir.startswith("hf_moe/") else "../../qwen3_moe/base"
        # Patterns only where PEFT fused the experts' targets itself.
        assert bool(cfg["rank_pattern"]) == (params is None), cfg
        (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        from safetensors.numpy import load_file
        saved = load_file(out / "adapter_model.safetensors")
        model.train()
        model.zero_grad()
        logits = model(input_ids=inputs).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        tensors += [(f"{name}.loss", np.array(loss.item(), dtype=np.float64)),
                    (f"{name}.logits0", logits[0].detach().numpy().astype(np.float64))]
        names = []
        for pname, p in model.named_parameters():
            if "lora_" not in pname:
                continue
            key = pname.replace(".default.", ".")
            assert key in saved, (key, sorted(saved))
            assert tuple(saved[key].shape) == tuple(p.shape), key
            tensors.append((f"{name}.grad.{key}", p.grad.detach().numpy().astype(np.float64)))
            names.append(key)
        assert sorted(names) == sorted(saved), name
        folders[name] = dict(seed=seed, base=base_dir, target_modules=modules, target_parameters=params,
                             wrappers=wrappers, tensors=sorted(names))
        print(f"{name}: loss {loss.item():.10f}, {len(names)} adapter tensors, {wrappers} expert wrappers; e.g. "
              + ", ".join(k for k in sorted(names) if "experts" in k)[:400])
    header = {
        "generator": {"script": "tools/moe_lora_fixtures.py", "torch": torch.__version__,
                      "transformers": transformers.__version__, "peft": peft.__version__,
                      "python": platform.python_version()},
        "folders": folders,
        "scalars": dict(seq=SEQ, windows=WINDOWS, rank=RANK, alpha=ALPHA),
    }
    return header, tensors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", type=Path, default=ROOT / "tests" / "fixtures" / "hf_moe_lora")
    ap.add_argument("--check", action="store_true", help="compare with the files in --out-dir instead of writing")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "hf_moe_lora"
        work.mkdir()
        header, tensors = generate(work)
        (work / "reference.bin").write_bytes(serialize(header, tensors))
        new = tree_bytes(work)
        print(f"{len(new)} files, {sum(len(b) for b in new.values())} bytes; torch {torch.__version__}, "
              f"transformers {transformers.__version__}, peft {peft.__version__}")
        return publish_tree(work, args.out_dir, args.check)


if __name__ == "__main__":
    sys.exit(main())
