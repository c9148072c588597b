#!/usr/bin/env python3
"""Tuner quality: the layout `weft train --auto` picks against brute force,
on several spaces, one row per space.

For each space (a model, sequence length and batch on 4 MPI ranks) brute
force profiles every candidate (--tune-all) and the tuner runs with its
defaults, both with the same trial settings and a fresh recipe cache. Then
both winners are re-measured side by side (alternating training runs,
median tokens/s of --repeats each). Targets: the tuner's pick within 2% of
brute force's winner, using at most 2% of its profiling time.

    python3 benchmarks/tuner_quality.py [--build build] [--spaces tiny-seq64 ...]
        [--journals benchmarks/tuner_journals] [--replay] [--repeats 5] [--keep DIR]

Brute force is the expensive half (tiny-seq64's 7,432 candidates at about 50
trials a minute on 2 cores: two and a half hours), so its journal and report
are kept, compressed, in --journals (one folder per space) and reused by
later runs; --brute-minutes N stops it and keeps the journal, the next run
goes on from it; --rebrute profiles again. Nothing else may run meanwhile:
a process sharing the cores slows steps in ways the trials' probe does not
see. --replay runs the
tuner against a copy of the brute-force journal instead of the machine: each
trial it picks is read from the journal (what that trial took when brute
force ran it counts as its cost), only the leaders' repeats run for real,
and nothing is re-measured. A rerun of every space then takes minutes, which
is how the search is developed; the targets are judged without --replay.

Runs `mpirun --oversubscribe` (as root it sets OMPI_ALLOW_RUN_AS_ROOT*). The
ranks share this machine's cores; the core count is printed with the numbers.
"""
import argparse, json, lzma, os, shutil, signal, statistics, subprocess, sys, tempfile, time

# name: (model, seq, global batch, ranks, extra training arguments[, pins
# of the space, for the tunings only]); None: the model is a pretrained
# folder (tiny, trained briefly and exported).
SPACES = {
    "tiny-seq64": ("tiny", 64, 16, 4, []),
    "small-seq256": ("small", 256, 16, 4, []),
    "tiny-seq1024": ("tiny", 1024, 8, 4, []),
    "lora-init": (None, 256, 16, 4, ["--lora", "8", "--lora-targets", "q,k,v,o,gate,up,down"]),
    # tiny-seq1024 with ZeRO-1 pinned: 1,670 valid layouts of its 5,720, every
    # other knob free (cp and its transports, attention, norm, checkpointing),
    # so that brute force fits in one session on 2 cores.
    "tiny-seq1024-zero1": ("tiny", 1024, 8, 4, [], ["--zero", "1"]),
    # lora-init with ZeRO-1 pinned: 1/4 of its 7,432 layouts (only the
    # adapters train, so the ZeRO stage shards just their gradients and
    # optimizer state), so that brute force fits in half an hour on 2 cores.
    "lora-init-zero1": (None, 256, 16, 4, ["--lora", "8", "--lora-targets", "q,k,v,o,gate,up,down"], ["--zero", "1"]),
    # small-seq256 cut to what brute force profiles in about an hour on 2
    # cores (its 9,744 layouts at 11 s a trial would take 30 hours): global
    # batch 8 and ZeRO-1, flash attention and the fused norm pinned; 657
    # valid layouts, the degrees, micro-batch, interleaving, sp, checkpointing,
    # cp and its transports and the pipeline splits free.
    "small-seq256-pinned": ("small", 256, 8, 4, [], ["--zero", "1", "--attn", "flash", "--norm", "fused"]),
    # An MoE space: tiny-moe (8 experts, top-2) with ZeRO-1 pinned; 7,584
    # valid layouts, the degrees (tp, cp and its transports, pp, dp, ep,
    # etp), the dispatcher, attention and norm kernels, micro-batch,
    # interleaving, sp, checkpointing and the pipeline splits free.
    "tiny-moe-seq128": ("tiny-moe", 128, 8, 4, [], ["--zero", "1"]),
    # Small enough for brute force in minutes, for developing the search.
    "dev-tiny-2ranks": ("tiny", 64, 8, 2, []),
}
TARGETS = ["tiny-seq64", "small-seq256", "tiny-seq1024", "lora-init"]


def stop_ranks(out):
    """SIGTERM to every process whose command line holds `out` (mpirun's ranks)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if out.encode() in cmdline and cmdline and os.path.basename(cmdline[0]) == b"weft":
            try:
                os.kill(int(pid), signal.SIGTERM)
            except OSError:
                pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--spaces", nargs="*", default=TARGETS, choices=list(SPACES))
    ap.add_argument("--brute-minutes", type=float, default=0,
                    help="stop brute force after this long and keep its journal; the next run goes on from it")
    ap.add_argument("--trial-min-time", type=float, default=0.2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30, help="steps of each re-measuring run")
    ap.add_argument("--journals", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuner_journals"),
                    help="where each space's brute-force journal is kept and reused")
    ap.add_argument("--rebrute", action="store_true", help="profile brute force again even when a journal is kept")
    ap.add_argument("--replay", action="store_true", help="the tuner against the brute-force journal (no re-measuring)")
    ap.add_argument("--keep", help="keep the runs in this folder")
    a = ap.parse_args()
    weft = os.path.abspath(os.path.join(a.build, "weft"))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_WAIT_POLICY="passive")
    tmp = a.keep or tempfile.mkdtemp()
    os.makedirs(tmp, exist_ok=True)
    env["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")

    def quiet(cmd):
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)

    data = os.path.join(tmp, "data")
    if not os.path.exists(data):
        text = os.path.join(tmp, "corpus.txt")
        with open(text, "w") as f:
            for i in range(4000):
                f.write(f"Layouts are chosen by measurement {i * 7919 % 10007}, not by guess.\n%\n")
        quiet([weft, "data", "prepare", "--input", text, "--out", data])
    base = os.path.join(tmp, "base")
    if any(s.startswith("lora-init") for s in a.spaces) and not os.path.exists(base):
        # A pretrained folder to fine-tune: tiny, trained briefly and exported.
        run = os.path.join(tmp, "base-run")
        quiet([weft, "train", "--model", "tiny", "--data", data, "--steps", "4", "--eval-every", "0",
               "--threads", "1", "--out", run, "--overwrite"])
        quiet([weft, "export", "--checkpoint", os.path.join(run, "checkpoints", "step_000004"), "--out", base])

    print(f"1 thread a rank on {os.cpu_count()} cores, fp32, trials of at least "
          f"{a.trial_min_time} s{'; replaying the brute-force journals' if a.replay else ''}", flush=True)
    rows, ok = [], True
    for name in a.spaces:
        model, seq, gb, ranks, extra, *pins = SPACES[name]
        pins = pins[0] if pins else []
        mpi = ["mpirun", "--oversubscribe", "-np", str(ranks), weft]
        common = (["--model", model] if model else ["--init", base]) + [
            "--seq", str(seq), "--global-batch", str(gb), "--threads", "1", "--eval-samples", "8",
            "--eval-every", "0", "--data", data] + extra
        space_dir = os.path.join(tmp, name)
        os.makedirs(space_dir, exist_ok=True)

        def tune(out, more, retune=True, minutes=0):
            t0 = time.time()
            cmd = mpi + ["train", "--auto", "--steps", "1", "--trial-min-time", str(a.trial_min_time),
                         "--out", out] + (["--retune"] if retune else []) + common + pins + more
            # A cache of its own: no tuning may reuse another's recipe.
            p = subprocess.Popen(cmd, env=dict(env, XDG_CACHE_HOME=os.path.join(out, "cache")),
                                 stdout=subprocess.DEVNULL)
            try:
                p.wait(timeout=minutes * 60 if minutes > 0 else None)
            except subprocess.TimeoutExpired:
                # Stopped as a user would stop it: every rank gets SIGTERM,
                # abandons its trial and leaves the journal whole.
                stop_ranks(out)
                p.wait()
                return None
            if p.returncode != 0:
                raise subprocess.CalledProcessError(p.returncode, cmd)
            rep = json.load(open(os.path.join(out, "tuning.json")))
            rep["wall"] = time.time() - t0
            return rep

        kept = os.path.join(a.journals, name)
        kept_journal, kept_report = os.path.join(kept, "journal.jsonl.xz"), os.path.join(kept, "tuning.json.xz")
        brute_journal = os.path.join(space_dir, "brute-journal.jsonl")
        if os.path.exists(kept_report) and not a.rebrute:
            brute = json.loads(lzma.open(kept_report, "rt").read())
            with lzma.open(kept_journal, "rb") as f, open(brute_journal, "wb") as g:
                shutil.copyfileobj(f, g)
        else:
            out = os.path.join(space_dir, "brute")
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(os.path.join(out, "tuning"))
            partial = os.path.exists(kept_journal) and not a.rebrute
            if partial:  # a brute force stopped earlier: it goes on from its journal
                with lzma.open(kept_journal, "rb") as f, open(os.path.join(out, "tuning", "journal.jsonl"), "wb") as g:
                    shutil.copyfileobj(f, g)
            brute = tune(out, ["--tune-all"], retune=not partial, minutes=a.brute_minutes)
            os.makedirs(kept, exist_ok=True)
            shutil.copy(os.path.join(out, "tuning", "journal.jsonl"), brute_journal)
            with open(brute_journal, "rb") as f, lzma.open(kept_journal, "wb") as g:
                shutil.copyfileobj(f, g)
            if brute is None:
                done = sum(1 for l in open(brute_journal) if '"kind":"result"' in l)
                print(f"{name}: brute force stopped after {a.brute_minutes:g} minutes with {done} trials in its "
                      f"journal, kept in {kept_journal}; the next run goes on from there", flush=True)
                ok = False
                continue
            with lzma.open(kept_report, "wt") as g:
                json.dump(brute, g)
        if a.replay:
            out = os.path.join(space_dir, "replay")
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(os.path.join(out, "tuning"))
            shutil.copy(brute_journal, os.path.join(out, "tuning", "journal.jsonl"))
            tuned = tune(out, [], retune=False)
        else:
            tuned = tune(os.path.join(space_dir, "tuner"), [])
        cost = tuned["profile_seconds"] + tuned.get("journal_seconds", 0)
        # Brute force's trials over all the runs that built its journal (a
        # resumed run profiles only the rest; the trials it read back count).
        brute_cost = brute["profile_seconds"] + brute.get("journal_seconds", 0)
        frac = cost / brute_cost

        winners = {"brute": brute["winner"], "tuner": tuned["winner"]}
        if a.replay:
            # The brute-force trials' own measurements of both winners, each
            # the mean of its trials' steady steps (measured * reference probe
            # / the trial's probe: the machine's drift taken out, as the
            # search does).
            ok_trials = [t for t in brute["trials"] if t["status"] == "ok"]
            probes = sorted(t.get("probe_s", 0) for t in ok_trials if t.get("probe_s", 0) > 0)
            ref = probes[len(probes) // 2] if probes else 0
            steady = {}
            for t in ok_trials:
                p = t.get("probe_s", 0)
                steady.setdefault(t["layout"], []).append(t["measured_s"] * ref / p if p > 0 and ref > 0
                                                          else t["measured_s"])
            tokens = gb * seq
            rate = {k: tokens / statistics.mean(steady[v]) if v in steady else float("nan")
                    for k, v in winners.items()}
        else:
            # Re-measure both winners, alternating, so that drift hits both alike.
            rates = {k: [] for k in winners}
            for rep in range(a.repeats):
                for who, layout in winners.items():
                    out = os.path.join(space_dir, f"measure-{who}-{rep}")
                    quiet(mpi + ["train", "--layout", layout, "--steps", str(a.steps), "--log-every",
                                 str(a.steps // 2), "--out", out, "--overwrite"] + common)
                    logged = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
                    rates[who].append(logged[-1]["tokens_per_s"])  # the window after warm-up
            rate = {k: statistics.median(v) for k, v in rates.items()}
        ratio = rate["tuner"] / rate["brute"]
        row_ok = ratio >= 0.98 and frac <= 0.02
        ok = ok and row_ok
        cal = tuned.get("calibration") or {}
        rows.append((name, brute["candidates"], brute.get("profiled", len(brute["trials"])),
                     brute_cost, tuned.get("profiled", len(tuned["trials"])),
                     tuned.get("repeats", 0), cost, frac, ratio, cal.get("rms_error_before"),
                     cal.get("rms_error_after"), tuned["stop_reason"], winners, row_ok))
        print(f"{name}: brute force {winners['brute']} ({rate['brute']:.0f} tok/s), tuner {winners['tuner']} "
              f"({rate['tuner']:.0f} tok/s): {100 * ratio:.1f}% at {100 * frac:.2f}% of the profiling time; "
              f"tuner stopped: {tuned['stop_reason']}", flush=True)

    print()
    print("| space | candidates | brute force: profiled, seconds | tuner: profiled + repeats, seconds | time share "
          "| tuner / brute tokens/s | cost model RMS before / after refit | result |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for (name, cands, bprof, bsec, tprof, trep, tsec, frac, ratio, before, after, stop, winners, row_ok) in rows:
        err = f"{100 * before:.1f}% / {100 * after:.1f}%" if before is not None else "-"
        print(f"| {name} | {cands} | {bprof}, {bsec:.0f} s | {tprof} + {trep}, {tsec:.1f} s | {100 * frac:.2f}% "
              f"| {100 * ratio:.1f}% | {err} | {'ok' if row_ok else 'MISSED'} |")
    print("\ntargets: tuner / brute >= 98% of the tokens/s, <= 2% of the profiling time"
          + (" (replayed: judged on brute force's own trials)" if a.replay else
             f" (median of {a.repeats} side-by-side runs each)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
