#!/usr/bin/env python3
"""Write the reference fixtures for weft's LoRA fine-tuning.

A link of the reference chain (docs: STYLE.md): Hugging Face `transformers` +
`peft` put LoRA adapters on the tiny pretrained model of
tests/fixtures/hf_init/untied/ (written by tools/hf_init_fixtures.py), save
them with `save_pretrained` exactly as a user's adapter folder would look,
and record on the CPU the loss, the adapter gradients and five AdamW updates;
weft must load each adapter folder and reproduce them. CI does not run this
script; its outputs are committed under tests/fixtures/lora/. To regenerate:

    pip install torch transformers peft safetensors numpy
    python3 tools/lora_fixtures.py           # writes tests/fixtures/lora/
    python3 tools/lora_fixtures.py --check   # regenerates in memory, compares

--check first compares bytes; where a file differs (another CPU or library
build can change the last bits of fp32 sums) it reads both reference.bin
files and passes only if every header field but "generator" and "scalars" is
equal and every tensor agrees within 1e-10 relative (f64) or 1e-5 relative
(f32) of the largest magnitude in that tensor; any other differing file fails.

Base model and data
-------------------
Base: tests/fixtures/hf_init/untied/ (LlamaForCausalLM, V=64 C=16 F=40 L=4
H=4 H_kv=2 D=8, untied lm_head, fp32), loaded with
LlamaForCausalLM.from_pretrained(..., attn_implementation="eager"); it is read,
never written. Tokens: tests/fixtures/hf_init/tokens.npy (73 int32 ids), cut
into W=6 windows of T=12 as hf_init_fixtures.py's windows() does: window w has
inputs tokens[w*T : w*T+T] and targets tokens[w*T+1 : w*T+T+1].

Adapters
--------
Each is a PEFT LoRA, LoraConfig(task_type="CAUSAL_LM", r, lora_alpha,
lora_dropout=0.0, target_modules, bias="none") applied by get_peft_model:
    all   r=4 lora_alpha=8  q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,
                            down_proj (every linear of every layer; not
                            lm_head)                          scaling 2.0
    qv    r=2 lora_alpha=3  q_proj,v_proj                     scaling 1.5
Scaling: PEFT's plain (not rsLoRA) rule, scaling = lora_alpha / r, with the
adapted projection y = x W^T + scaling * (x A^T) B^T, A = lora_A (r, in),
B = lora_B (out, r). The script asserts that rule against the peft module by
hand (layer 0's q_proj, 1e-12 in fp64).
Initial values: both A and B nonzero, so that step 0 already moves A: one
torch.Generator seeded with the adapter's seed (all 20250401, qv 20250402)
draws, in named_parameters() order, lora_A = normal(0,1) / sqrt(in_features)
and lora_B = 0.5 * normal(0,1) / sqrt(r), in fp32.

Folders
-------
<a>/adapter/   model.save_pretrained() of the initial fp32 adapter:
               adapter_config.json and adapter_model.safetensors (fp32,
               tensor names base_model.model.model.layers.{i}.{self_attn,mlp}
               .{q,k,v,o,gate,up,down}_proj.lora_{A,B}.weight). peft's
               generated README.md is removed. base_model_name_or_path is
               rewritten to "../../../hf_init/untied", the base folder
               relative to the adapter folder itself (peft would write the
               absolute path of this machine); peft does not read that field
               back here, the base is always passed in explicitly.

reference.bin (tools/golden_llama.py's format, read by
tests/unit/golden/golden_file.h). <a> is all or qv, <P> ranges over the
tensor names in <a>/adapter/adapter_model.safetensors (in that file's order),
<k> over the adapter's grad_steps (header "adapters".<a>.grad_steps): every
step 0..4 for qv, only steps 0 and 4 for all (its five f64 gradient sets
alone would take 210 KB of data and 50 KB of header; the five losses and the
final tensors still pin down steps 1-3):
    <a>.loss          f64 (5,)     mean cross-entropy over the W*T targets
                                   before update k (fp64 run: base and
                                   adapter widened with model.double())
    <a>.loss_f32      f32 (5,)     the same in fp32
    <a>.grad<k>.<P>   f64 (shape of P)  d loss / d P at step k (before
                                   update k), fp64 run
    <a>.final.<P>     f64 (shape of P)  P after the 5 updates, fp64 run
    <a>.logits0       f64 (T, V)   logits of window 0, initial adapter, fp64
    <a>.logits0_f32   f32 (T, V)   the same in fp32
    <a>.merged.model.layers.{0,3}.self_attn.q_proj.weight   f32 (32, 16)
    <a>.merged.model.layers.{0,3}.mlp.down_proj.weight      f32 (16, 40)
                                   merge_and_unload() of the initial fp32
                                   adapter model: W + scaling * B A, in fp32
                                   (for qv, down_proj is the base weight)
    <a>.merged.loss   f32 ()       the merged fp32 model's loss
Full merged folders are not written: two 68 KB copies of the model would
push tests/fixtures/lora/ over its size budget, and the merged loss plus
these four weights pin the merge down.
Optimizer, both runs: 5 steps of torch.optim.AdamW over the adapter tensors
only (the base is frozen, as peft leaves it), lr 1e-2 constant, betas (0.9,
0.95), eps 1e-8, weight_decay 0.1 (decoupled, applied to every adapter
tensor), no gradient clipping, no warm-up; every step uses the same batch of
all 6 windows. The header's "scalars" hold seq, windows, steps, lr, beta1,
beta2, eps, weight_decay, <a>.r, <a>.alpha, <a>.scaling, <a>.seed, the
losses as JSON numbers (<a>.loss<k> and <a>.loss_f32_<k> for k = 0..4,
<a>.merged_loss); "optimizer" repeats the AdamW settings; "adapters" holds
each adapter's r, lora_alpha, scaling, target_modules, seed, grad_steps and
adapter files.

Checks the script asserts while generating: the adapter folder reloads to
the same tensors; the hand computation of q_proj above (1e-12); fp32 and
fp64 losses agree to 1e-6 relative at every step; the merged model's logits
match the unmerged fp32 ones (1e-4 absolute) and its loss the fp32 loss
(1e-6 relative).

The output is deterministic: one thread, deterministic algorithms, fixed
seeds, JSON written in a fixed key order.
"""

import argparse
import copy
import json
import platform
import shutil
import struct
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.numpy import load_file
from transformers import LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from golden_llama import serialize  # noqa: E402  (same file format)
from hf_init_fixtures import SEQ, WINDOWS, mean_loss, windows  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BASE_DIR = ROOT / "tests" / "fixtures" / "hf_init" / "untied"
TOKENS = ROOT / "tests" / "fixtures" / "hf_init" / "tokens.npy"
BASE_REL = "../../../hf_init/untied"  # from tests/fixtures/lora/<a>/adapter/

STEPS = 5
LR = 1e-2
BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.1
B_SCALE = 0.5

ADAPTERS = {
    "all": dict(r=4, alpha=8, seed=20250401, grad_steps=[0, 4],
                targets=["q_proj", "k_proj", "v_proj", "o_proj",
                         "gate_proj", "up_proj", "down_proj"]),
    "qv": dict(r=2, alpha=3, seed=20250402, grad_steps=[0, 1, 2, 3, 4],
               targets=["q_proj", "v_proj"]),
}
MERGED = [f"model.layers.{i}.{m}.weight" for i in (0, 3)
          for m in ("self_attn.q_proj", "mlp.down_proj")]


def load_base(dtype=torch.float32) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(BASE_DIR, dtype=dtype,
                                            attn_implementation="eager").eval()


def saved_name(name: str) -> str:
    """named_parameters() name -> adapter_model.safetensors name."""
    return name.replace(".default.", ".")


def lora_params(model) -> list:
    return [(saved_name(n), p) for n, p in model.named_parameters() if p.requires_grad]


def make_adapter(spec: dict, out: Path):
    """The initial fp32 PEFT model of `spec`, saved to `out`."""
    config = LoraConfig(task_type="CAUSAL_LM", r=spec["r"], lora_alpha=spec["alpha"],
                        lora_dropout=0.0, target_modules=spec["targets"], bias="none")
    model = get_peft_model(load_base(), config).eval()
    g = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_A." in name:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            elif ".lora_B." in name:
                p.copy_(B_SCALE * torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            else:
                assert not p.requires_grad, name
    model.save_pretrained(out)
    (out / "README.md").unlink(missing_ok=True)
    cfg_path = out / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = BASE_REL
    cfg["target_modules"] = sorted(cfg["target_modules"])  # peft keeps a set
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return model


def load_adapter(out: Path, dtype) -> PeftModel:
    """What weft loads: the base plus the saved adapter folder, trainable."""
    model = PeftModel.from_pretrained(load_base(), out, is_trainable=True)
    return model.to(dtype).eval()


def check_scaling(model, spec: dict, inputs) -> None:
    """y = x W^T + (alpha/r) (x A^T) B^T for layer 0's q_proj, by hand."""
    mod = model.base_model.model.model.layers[0].self_attn.q_proj
    assert mod.scaling["default"] == spec["alpha"] / spec["r"], mod.scaling
    seen = {}
    h = mod.register_forward_hook(lambda m, a, y: seen.update(x=a[0], y=y))
    with torch.no_grad():
        model(input_ids=inputs)
        x, W = seen["x"], mod.base_layer.weight
        A, B = mod.lora_A["default"].weight, mod.lora_B["default"].weight
        hand = x @ W.T + (spec["alpha"] / spec["r"]) * ((x @ A.T) @ B.T)
        err = ((hand - seen["y"]).abs().max() / seen["y"].abs().max()).item()
        # The adapter term matters: without it the output moves by far more.
        far = ((x @ W.T - seen["y"]).abs().max() / seen["y"].abs().max()).item()
    h.remove()
    assert err <= 1e-12 and far > 1e-2, (err, far)


def train(model, inputs, targets) -> dict:
    params = lora_params(model)
    opt = torch.optim.AdamW([p for _, p in params], lr=LR, betas=BETAS, eps=ADAM_EPS,
                            weight_decay=WEIGHT_DECAY)
    losses, grads = [], []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = mean_loss(model(input_ids=inputs).logits, targets)
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.detach().clone() for n, p in params})
        opt.step()
    return dict(losses=losses, grads=grads,
                final={n: p.detach().clone() for n, p in params})


def generate(workdir: Path) -> tuple[dict, list]:
    tokens = np.load(TOKENS)
    assert tokens.shape == (WINDOWS * SEQ + 1,), tokens.shape
    inputs, targets = windows(tokens)

    tensors = []
    scalars = dict(seq=SEQ, windows=WINDOWS, steps=STEPS, lr=LR, beta1=BETAS[0],
                   beta2=BETAS[1], eps=ADAM_EPS, weight_decay=WEIGHT_DECAY)
    adapters = {}
    for a, spec in ADAPTERS.items():
        out = workdir / a / "adapter"
        init = make_adapter(spec, out)
        saved = load_file(str(out / "adapter_model.safetensors"))
        names = list(saved)
        assert sorted(names) == sorted(n for n, _ in lora_params(init)), names
        init_state = {n: p.detach() for n, p in lora_params(init)}

        runs = {}
        for dtype in (torch.float64, torch.float32):
            model = load_adapter(out, dtype)
            # The folder round-trips exactly.
            for n, p in lora_params(model):
                assert torch.equal(p.float(), init_state[n]), n
            assert all(p.dtype == dtype for p in model.parameters())
            with torch.no_grad():
                logits0 = model(input_ids=inputs[:1]).logits[0].clone()
            if dtype == torch.float64:
                check_scaling(model, spec, inputs)
            runs[dtype] = dict(train(model, inputs, targets), logits0=logits0)
        r64, r32 = runs[torch.float64], runs[torch.float32]
        for l64, l32 in zip(r64["losses"], r32["losses"]):
            assert abs(l64 - l32) <= 1e-6 * abs(l64), (l64, l32)

        merged = copy.deepcopy(init).merge_and_unload().eval()
        assert isinstance(merged, LlamaForCausalLM)
        with torch.no_grad():
            merged_logits = merged(input_ids=inputs).logits
            merged_loss = mean_loss(merged_logits, targets)
            peft_logits = init(input_ids=inputs).logits
        assert (merged_logits - peft_logits).abs().max().item() <= 1e-4
        assert abs(merged_loss.item() - r32["losses"][0]) <= 1e-6 * r32["losses"][0]
        msd = merged.state_dict()

        tensors += [(f"{a}.loss", np.array(r64["losses"], dtype=np.float64)),
                    (f"{a}.loss_f32", np.array(r32["losses"], dtype=np.float32))]
        for k in spec["grad_steps"]:
            tensors += [(f"{a}.grad{k}.{n}", r64["grads"][k][n].numpy()) for n in names]
        tensors += [(f"{a}.final.{n}", r64["final"][n].numpy()) for n in names]
        tensors += [(f"{a}.logits0", r64["logits0"].numpy()),
                    (f"{a}.logits0_f32", r32["logits0"].numpy())]
        tensors += [(f"{a}.merged.{n}", msd[n].numpy()) for n in MERGED]
        tensors.append((f"{a}.merged.loss", merged_loss.numpy()))
        assert all(t.dtype in (np.float64, np.float32) for _, t in tensors)

        scalars.update({f"{a}.r": spec["r"], f"{a}.alpha": spec["alpha"],
                        f"{a}.scaling": spec["alpha"] / spec["r"], f"{a}.seed": spec["seed"]})
        scalars.update({f"{a}.loss{k}": v for k, v in enumerate(r64["losses"])})
        scalars.update({f"{a}.loss_f32_{k}": v for k, v in enumerate(r32["losses"])})
        scalars[f"{a}.merged_loss"] = merged_loss.item()
        adapters[a] = dict(r=spec["r"], lora_alpha=spec["alpha"],
                           scaling=spec["alpha"] / spec["r"],
                           target_modules=spec["targets"], seed=spec["seed"],
                           init=f"lora_A normal(0,1)/sqrt(in), lora_B {B_SCALE}*normal(0,1)/sqrt(r)",
                           grad_steps=spec["grad_steps"],
                           files=sorted(p.name for p in out.iterdir()))
    header = {
        "generator": {
            "script": "tools/lora_fixtures.py",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "python": platform.python_version(),
            "attn_implementation": "eager",
        },
        "config": {"base": "tests/fixtures/hf_init/untied",
                   "tokens": "tests/fixtures/hf_init/tokens.npy"},
        "optimizer": {"name": "AdamW", "lr": LR, "schedule": "constant",
                      "betas": list(BETAS), "eps": ADAM_EPS,
                      "weight_decay": WEIGHT_DECAY, "grad_clip": None,
                      "steps": STEPS, "params": "adapter tensors only"},
        "adapters": adapters,
        "scalars": scalars,
    }
    return header, tensors


def tree_bytes(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def parse(blob: bytes) -> tuple[dict, dict]:
    n = struct.unpack("<I", blob[12:16])[0]
    header = json.loads(blob[16:16 + n])
    data = blob[16 + n:]
    codes = {"f32": "<f4", "f64": "<f8", "i32": "<i4"}
    arrays = {k: np.frombuffer(data[v["offset"]:v["offset"] + v["nbytes"]], dtype=codes[v["dtype"]])
              for k, v in header["tensors"].items()}
    return header, arrays


def close(new: bytes, old: bytes) -> bool:
    """The tolerance rule of --check for two reference.bin files."""
    hn, an = parse(new)
    ho, ao = parse(old)
    keys = hn.keys() - {"generator", "scalars", "tensors"}
    ok = hn.keys() == ho.keys() and all(hn[k] == ho[k] for k in keys)
    ok = ok and {k: (v["dtype"], v["shape"]) for k, v in hn["tensors"].items()} == \
        {k: (v["dtype"], v["shape"]) for k, v in ho["tensors"].items()}
    if not ok:
        return False
    worst = 0.0
    for k, a in an.items():
        b = ao[k]
        tol = 1e-10 if a.dtype == np.float64 else 1e-5
        rel = np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-30)
        worst = max(worst, rel)
        if rel > tol:
            print(f"  {k}: relative difference {rel:.3e} > {tol}")
            return False
    print(f"  reference.bin: bytes differ, largest relative difference {worst:.3e} within tolerance")
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", type=Path, default=ROOT / "tests" / "fixtures" / "lora")
    ap.add_argument("--check", action="store_true",
                    help="compare with the files in --out-dir instead of writing")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
    transformers.utils.logging.disable_progress_bar()

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "lora"
        work.mkdir()
        header, tensors = generate(work)
        (work / "reference.bin").write_bytes(serialize(header, tensors))
        new = tree_bytes(work)
        total = sum(len(b) for b in new.values())
        s = header["scalars"]
        for a in ADAPTERS:
            print(f"{a}: loss " + " ".join(f"{s[f'{a}.loss{k}']:.6f}" for k in range(STEPS)))
        print(f"{len(new)} files, {total} bytes; torch {torch.__version__}, "
              f"transformers {transformers.__version__}, peft {peft.__version__}")
        if args.check:
            old = tree_bytes(args.out_dir) if args.out_dir.exists() else {}
            status = 0
            for k in sorted(new.keys() | old.keys()):
                if new.get(k) == old.get(k):
                    continue
                if k == "reference.bin" and k in old and close(new[k], old[k]):
                    continue
                print(f"  DIFFERS: {k}")
                status = 1
            print("matches" if status == 0 else "DIFFERS from", args.out_dir)
            return status
        if args.out_dir.exists():
            shutil.rmtree(args.out_dir)
        args.out_dir.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(work, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
