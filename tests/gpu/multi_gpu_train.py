#!/usr/bin/env python3
"""Training over several ranks against one: small models train for a few
steps under layouts that spread them over 2 and 4 ranks, each started with
`mpirun`, and every step's loss is compared with the same run on one rank
(same model, FP8 recipe, gradient precision and LoRA). The cases: context
parallelism with each transport, tensor (with sequence), pipeline and data
parallelism with ZeRO 0-3, FP8 under tp and pp (tensorwise, delayed and
blockwise), LoRA under tp, bf16 gradients under dp, 4-rank grids, a
Mixture of Experts under expert parallelism (over dp, and folded over the
tp ranks) and with its experts split over tp, a checkpoint written under
one layout and resumed under another, an MoE batch routed past the
receive buffers (the run stops with the checkpoint of the step before, and
resumes to the same losses), and
`weft train --auto` tuning over 2 ranks.

    python3 tests/gpu/multi_gpu_train.py --weft build/weft [--device gpu|cpu] [--steps 20]
        [--jobs N] [--memcheck] [--summary FILE] [--only SUBSTRING ...]

On GPUs (the default) the rule is the bf16 training tests'
(tests/gpu/test_gpu_train.cpp): every step within 4/256 of the one-rank
loss, the mean within 1/256. The ranks take the GPUs in turn; where there
are fewer GPUs than ranks, they share them and weft's `--comm auto` carries
their tensors over MPI through host memory (NCCL needs a GPU per rank): the
summary says which communicator each run used, from its run header. With
--device cpu the same runs go over MPI on host memory in fp32, held to 1e-5
(the layout parity tests' rule), FP8 cases to 3e-3 (splitting a sum moves a
few values across an FP8 rounding boundary); cases that need a GPU (bf16
gradients) are left out there. That is how this script is itself checked on
machines without GPUs.

--memcheck runs a 2-rank layout of each collective pattern (the cp ring's
point-to-point, its all-gather and all-to-all, tp's gather and
reduce-scatter, pp's send and receive, ZeRO-3's uneven gathers) for 2 steps
under compute-sanitizer's memcheck on every rank. --jobs runs that many
cases at once (the GPU's memory is shared; the losses do not depend on it).
"""
import argparse, concurrent.futures, json, os, shutil, subprocess, sys, tempfile, time

ONE = "tp1-pp1-dp1-mb1-attn:flash"
# (ranks, layout, model, extra arguments); flash and cuDNN's attention take
# the ring's and the all-gather's blocks of the sequence; cp:a2a calls it on
# the whole sequence of H / cp heads, which the materialized kernel takes too
# (each against the one-rank flash run, within the same rule).
CASES = [
    (2, "tp1-cp2-pp1-dp1-mb1-attn:flash-cp:ring", "tiny", []),
    (2, "tp1-cp2-pp1-dp1-mb1-attn:flash-cp:allgather", "tiny", []),
    (2, "tp1-cp2-pp1-dp1-mb1-attn:flash-cp:a2a", "tiny", []),
    (2, "tp1-cp2-pp1-dp1-mb1-attn:cudnn-cp:ring", "tiny", []),
    (2, "tp1-cp2-pp1-dp1-mb1-attn:cudnn-cp:allgather", "tiny", []),
    (2, "tp1-cp2-pp1-dp1-mb1-attn:cudnn-cp:a2a", "tiny", []),
    (2, "tp1-cp2-pp1-dp1-mb1-attn:materialized-cp:a2a", "tiny", []),
    (2, "tp1-cp2-pp1-dp1-mb1-attn:flash-ckpt:full-cp:ring", "tiny", []),
    (2, "tp2-pp1-dp1-mb1-sp-attn:flash", "tiny", []),
    (2, "tp1-pp2-dp1-mb1-attn:flash", "tiny", []),
    (2, "tp1-pp2-dp1-mb1-vpp2-attn:flash", "tiny", []),
    # Uneven pipeline splits: a lighter first stage, and virtual stages of
    # only the embedding and only the head.
    (2, "tp1-pp2-dp1-mb1-attn:flash-split:1.3", "tiny", []),
    (2, "tp1-pp2-dp1-mb1-vpp2-attn:flash-split:0.2.2.0", "tiny", []),
    (2, "tp1-pp1-dp2-mb1-attn:flash-zero1", "tiny", []),
    (2, "tp1-pp1-dp2-mb1-attn:flash-zero2", "tiny", []),
    (2, "tp1-pp1-dp2-mb1-attn:flash-zero3", "tiny", []),
    (2, "tp1-pp1-dp2-mb1-attn:flash-grad:bf16", "tiny", []),
    (2, "tp2-pp1-dp1-mb1-sp-attn:flash-fp8:tensorwise", "tiny", []),
    (2, "tp1-pp2-dp1-mb1-attn:flash-fp8:delayed", "tiny", []),
    # Under tp2 only small's attention GEMMs have dims that are multiples of
    # 128, which block scaling needs.
    (2, "tp2-pp1-dp1-mb1-sp-attn:flash-fp8:blockwise", "small", []),
    (2, "tp2-pp1-dp1-mb1-attn:flash", "tiny", ["--lora", "8", "--lora-targets", "q,k,v,o,gate,up,down"]),
    # 259 ids under tp 2: padded to 512 rows, the padding masked out of the loss.
    (2, "tp2-pp1-dp1-mb1-sp-attn:flash", "tiny", ["--vocab", "259"]),
    (4, "tp2-pp2-dp1-mb1-attn:flash", "tiny", []),
    (4, "tp2-cp2-pp1-dp1-mb1-sp-attn:flash-cp:ring", "tiny", []),
    (4, "tp1-cp4-pp1-dp1-mb1-attn:flash-cp:ring", "tiny", []),
    (4, "tp1-pp1-dp4-mb1-attn:flash-zero3", "tiny", []),
    # Mixtures of experts: expert parallelism over dp (all-to-all), the
    # experts' width split over tp under sp, and the ep group folded over
    # the tp ranks (alone, and with ZeRO-1 over dp); under ZeRO the ep
    # replicas split the dense elements' bf16 master and moments (zero1: of
    # the whole stage; zero3: of each of two shards).
    (2, "tp1-pp1-dp2-ep2-mb1-attn:flash", "tiny-moe", []),
    (2, "tp2-pp1-dp1-etp2-mb1-sp-attn:flash", "tiny-moe", []),
    (2, "tp2-pp1-dp1-ep2-epfold-mb1-sp-attn:flash", "tiny-moe", []),
    (4, "tp2-pp1-dp2-ep4-epfold-mb1-sp-attn:flash-zero1", "tiny-moe", []),
    (4, "tp1-pp1-dp4-ep2-mb1-attn:flash-zero3", "tiny-moe", []),
]
# Saved under the first layout halfway, resumed under the second.
RESUME = (2, "tp2-pp1-dp1-mb1-sp-attn:flash", "tp1-pp2-dp1-mb1-attn:flash")
MEMCHECK = [
    "tp1-cp2-pp1-dp1-mb1-attn:flash-cp:ring",
    "tp1-cp2-pp1-dp1-mb1-attn:flash-cp:allgather",
    "tp1-cp2-pp1-dp1-mb1-attn:flash-cp:a2a",
    "tp2-pp1-dp1-mb1-sp-attn:flash",
    "tp1-pp2-dp1-mb1-attn:flash",
    "tp1-pp1-dp2-mb1-attn:flash-zero3",
]


def knob(layout, name):
    """The layout's knob ("-fp8:...", "-grad:bf16"), or "" without one."""
    at = layout.find("-" + name + ":")
    if at < 0:
        return ""
    end = layout.find("-", at + 1)
    return layout[at:] if end < 0 else layout[at:end]


def gpu_count():
    if not shutil.which("nvidia-smi"):
        return 0
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU ")) if r.returncode == 0 else 0


def records(path):
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def losses(path):
    return {r["step"]: r["loss"] for r in records(path) if r.get("kind") == "train"}


def comm_of(path):
    """The communicator the run header names ("nccl", "mpi", ...), or "?"."""
    for r in records(path):
        if r.get("kind") == "run" and r.get("comm"):
            return r["comm"].get("backend", "?")
    return "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=0, help="cases at once (default: 4 on GPUs, 1 on the CPU)")
    ap.add_argument("--memcheck", action="store_true")
    ap.add_argument("--summary", help="also write the table here (markdown)")
    ap.add_argument("--only", nargs="*", default=[], help="run the cases whose layout contains one of these")
    ap.add_argument("--data", help="training tokens (default: weft's built-in corpus)")
    a = ap.parse_args()
    if a.device == "gpu" and gpu_count() < 1:
        print("multi_gpu_train: no GPU here; skipped")
        return 77
    if not shutil.which("mpirun"):
        print("multi_gpu_train: no mpirun here; skipped")
        return 77
    weft = os.path.abspath(a.weft)
    jobs = a.jobs or (4 if a.device == "gpu" else 1)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_WAIT_POLICY="passive", WEFT_DEVICE=a.device)
    per_step, mean_rule = (4 / 256, 1 / 256) if a.device == "gpu" else (1e-5, 1e-5)
    steps = a.steps - a.steps % 2  # the resume case saves halfway
    base = ["train", "--seq", "256", "--global-batch", "4", "--warmup", "2", "--log-every", "1",
            "--eval-every", "0", "--threads", "1"] + (["--data", os.path.abspath(a.data)] if a.data else [])
    cases = [c for c in CASES if not a.only or any(s in c[1] for s in a.only)]
    if a.device == "cpu":
        # bf16 gradients and cuDNN's attention are for GPUs.
        cases = [c for c in cases if not knob(c[1], "grad") and knob(c[1], "attn") != "-attn:cudnn"]
    rows, failed = [], 0

    def add_row(row):
        # Each row as it is judged too, so that a run cut short by a time
        # limit still shows the cases it finished.
        rows.append(row)
        print("case:", " | ".join(str(x) if not isinstance(x, float) else f"{x:.3g}" for x in row), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        def run(ranks, layout, model, extra, out, more=(), sanitize=False, n=steps):
            cmd = [weft] + base + ["--model", model, "--steps", str(n), "--layout", layout, "--out", out] + list(extra) + list(more)
            if sanitize:
                cmd = ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1"] + cmd
            if ranks > 1:
                cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] + cmd
            t0 = time.time()
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            return r, time.time() - t0

        def train(ranks, layout, model, extra, tag):
            out = tempfile.mkdtemp(prefix=f"{tag}-{ranks}-", dir=tmp)
            r, secs = run(ranks, layout, model, extra, out, ["--no-checkpoint"])
            if r.returncode != 0:
                sys.stdout.write(f"--- {ranks} ranks {layout} ({model}) failed, exit {r.returncode}:\n"
                                 + r.stdout[-3000:] + r.stderr[-3000:])
                return None, "?", secs
            path = os.path.join(out, "metrics.jsonl")
            return losses(path), comm_of(path), secs

        def baseline_key(layout, model, extra):
            return (model, knob(layout, "fp8"), knob(layout, "grad"), tuple(extra))

        ones = {}
        for ranks, layout, model, extra in cases + [(RESUME[0], RESUME[1], "tiny", [])]:
            ones.setdefault(baseline_key(layout, model, extra), None)
        def one(key):
            model, fp8, grad, extra = key
            return key, train(1, ONE + grad + fp8, model, list(extra), "one")
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            for key, (got, _, _) in pool.map(one, list(ones)):
                ones[key] = got
        # The resume case's baseline: a constant schedule, so that a run of
        # half the steps follows a whole one.
        constant = ["--schedule", "constant"]
        ones_constant, _, _ = train(1, ONE, "tiny", constant, "one-constant")
        for key, got in list(ones.items()) + [(("tiny", "", "", ("constant",)), ones_constant)]:
            if got is None or len(got) != steps:
                print(f"multi_gpu_train: the one-rank run {key} failed")
                return 1

        fp8_rule = 3e-3 if a.device == "cpu" else per_step

        def judge(name, ranks, one_losses, got, comm, secs):
            nonlocal failed
            if got is None or sorted(got) != sorted(one_losses):
                failed += 1
                add_row((name, ranks, comm, None, None, "FAILED (the run failed or logged other steps)", secs))
                return
            rel = [abs(got[s] - one_losses[s]) / abs(one_losses[s]) for s in sorted(one_losses)]
            worst, mean = max(rel), sum(rel) / len(rel)
            fp8 = "-fp8:" in name
            rule_w, rule_m = (fp8_rule, fp8_rule) if fp8 and a.device == "cpu" else (per_step, mean_rule)
            ok = worst <= rule_w and mean <= rule_m
            failed += not ok
            add_row((name, ranks, comm, worst, mean, "ok" if ok else "FAILED", secs))

        def case(c):
            ranks, layout, model, extra = c
            return c, train(ranks, layout, model, extra, "many")
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            for (ranks, layout, model, extra), (got, comm, secs) in pool.map(case, cases):
                name = layout + ("" if model == "tiny" else f" ({model})") + (" lora" if "--lora" in extra else "")
                judge(name, ranks, ones[baseline_key(layout, model, extra)], got, comm, secs)

        # A checkpoint saved under one layout and resumed under another.
        ranks, first, second = RESUME
        out = os.path.join(tmp, "resume")
        t0 = time.time()
        r1, _ = run(ranks, first, "tiny", constant, out, ["--ckpt-every", "0"], n=steps // 2)
        r2, _ = run(ranks, second, "tiny", constant, out, ["--resume", "--no-checkpoint"]) if r1.returncode == 0 else (r1, 0)
        if r1.returncode != 0 or r2.returncode != 0:
            bad = r1 if r1.returncode != 0 else r2
            sys.stdout.write(f"--- resume case failed, exit {bad.returncode}:\n" + bad.stdout[-3000:] + bad.stderr[-3000:])
            got = None
        else:
            got = losses(os.path.join(out, "metrics.jsonl"))
        judge(f"{first} -> {second} at step {steps // 2}", ranks, ones_constant, got,
              comm_of(os.path.join(out, "metrics.jsonl")), time.time() - t0)

        # An MoE micro-batch routed past expert parallelism's receive
        # buffers: every rank stops before that step's update (exit 2) with
        # the checkpoint of the step before; resumed with the worst case's
        # buffers, every step is the one-rank run's. The buffers are set
        # between the most rows received before the step that first
        # received more and that step's (a run with the worst case's
        # buffers says each step's received peak); any step from the
        # second may stop it, as rows near the limit may move on a GPU.
        t0 = time.time()
        moe, ep_layout = "tiny-moe", "tp1-pp1-dp2-ep2-mb1-attn:flash"
        key = baseline_key(ONE, moe, ())
        if ones.get(key) is None:
            ones[key], _, _ = train(1, ONE, moe, [], "one")
        out = os.path.join(tmp, "overflow-ref")
        r0, _ = run(2, ep_layout, moe, ["--moe-imbalance", "0"], out, ["--no-checkpoint"])
        rows_k = 256 * 2  # seq x top-k: the balanced rows of a micro-batch
        most = [round(x["expert_load"]["received_peak"] * rows_k) for x in records(os.path.join(out, "metrics.jsonl"))
                if x.get("kind") == "train"]
        jumps = [(most[i] - max(most[:i]), i) for i in range(1, len(most)) if most[i] > max(most[:i])]
        why, got, last = "", None, -1
        if r0.returncode != 0 or len(most) != steps or not jumps:
            why = f"the reference run (exit {r0.returncode}, received {most}) gave no step to stop at"
        else:
            gap, at = max(jumps)
            room = max(most[:at]) + (gap - 1) // 2
            out = os.path.join(tmp, "overflow")
            r1, _ = run(2, ep_layout, moe, ["--moe-imbalance", f"{(room - 0.5) / rows_k:.17g}"], out, [])
            end = next((x for x in records(os.path.join(out, "metrics.jsonl")) if x.get("kind") == "end"), {})
            last = end.get("last_step", -1)
            ckpt = os.path.join(out, "checkpoints", f"step_{last:06d}")
            if r1.returncode != 2 or last < 1 or not os.path.isdir(ckpt) or \
                    not end.get("error", "").startswith(f"step {last + 1}: MoE layer"):
                why = (f"exit {r1.returncode} (2 expected), end record {end}, checkpoint {ckpt} "
                       f"{'present' if os.path.isdir(ckpt) else 'missing'}")
            else:
                r2, _ = run(2, ep_layout, moe, ["--moe-imbalance", "0", "--change", "moe-imbalance"], out,
                            ["--resume", "--no-checkpoint"])
                if r2.returncode != 0:
                    why = f"the resume failed, exit {r2.returncode}:\n" + r2.stdout[-3000:] + r2.stderr[-3000:]
                else:
                    got = losses(os.path.join(out, "metrics.jsonl"))
        if why:
            sys.stdout.write(f"--- MoE overflow case: {why}\n")
        stopped = f" at step {last + 1}" if got is not None else ""
        judge(f"{ep_layout} ({moe}) past its receive buffers{stopped}, resumed", 2, ones[key], got,
              comm_of(os.path.join(tmp, "overflow", "metrics.jsonl")), time.time() - t0)

        # Tuning over 2 ranks: it must finish and train with its pick.
        out = os.path.join(tmp, "auto")
        t0 = time.time()
        cmd = ["mpirun", "--oversubscribe", "-np", "2", weft] + base + [
            "--model", "tiny", "--steps", "4", "--auto", "--tune-top", "4", "--trial-warmup", "1",
            "--trial-steps", "2", "--trial-min-time", "0", "--no-checkpoint", "--out", out]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        header = next((x for x in records(os.path.join(out, "metrics.jsonl")) if x.get("kind") == "run"), {})
        trained = len(losses(os.path.join(out, "metrics.jsonl")))
        ok = r.returncode == 0 and trained == 4 and header.get("world") == 2
        if not ok:
            sys.stdout.write(f"--- weft train --auto over 2 ranks: exit {r.returncode}, {trained} steps:\n"
                             + r.stdout[-3000:] + r.stderr[-3000:])
        failed += not ok
        add_row((f"--auto over 2 ranks: {header.get('layout', '?')}", 2,
                     (header.get("comm") or {}).get("backend", "?"), None, None, "ok" if ok else "FAILED",
                     time.time() - t0))

        if a.memcheck and a.device == "gpu" and shutil.which("compute-sanitizer"):
            def sanitized(layout):
                out = os.path.join(tmp, f"memcheck-{layout}")
                r, secs = run(2, layout, "tiny", [], out, ["--no-checkpoint"], sanitize=True, n=2)
                return layout, r, secs
            with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
                for layout, r, secs in pool.map(sanitized, MEMCHECK):
                    ok = r.returncode == 0
                    if not ok:
                        sys.stdout.write(f"--- memcheck {layout}: exit {r.returncode}:\n" + r.stdout[-4000:] + r.stderr[-4000:])
                    failed += not ok
                    add_row((f"memcheck {layout}", 2, comm_of(os.path.join(tmp, f"memcheck-{layout}", "metrics.jsonl")),
                                 None, None, "clean" if ok else "FAILED", secs))

    head = (f"device {a.device}, {gpu_count() if a.device == 'gpu' else 0} GPU(s); rule: every step within "
            f"{per_step:.3g}, the mean within {mean_rule:.3g} (relative, against one rank"
            f"{'; FP8 cases 3e-3' if a.device == 'cpu' else ''}); {steps} steps")
    lines = ["| case | ranks | comm | worst | mean | result | seconds |", "|---|---:|---|---:|---:|---|---:|"]
    for name, ranks, comm, worst, mean, result, secs in rows:
        w = f"{worst:.2e}" if worst is not None else ""
        m = f"{mean:.2e}" if mean is not None else ""
        lines.append(f"| {name} | {ranks} | {comm} | {w} | {m} | {result} | {secs:.0f} |")
    tail = f"multi_gpu_train: {len(rows) - failed} of {len(rows)} cases passed"
    print(head)
    print("\n".join(lines))
    print(tail)
    if a.summary:
        with open(a.summary, "w") as f:
            f.write(head + "\n\n" + "\n".join(lines) + "\n\n" + tail + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
