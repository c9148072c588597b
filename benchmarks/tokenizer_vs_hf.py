#!/usr/bin/env python3
"""Tokenization throughput, weft beside Hugging Face `tokenizers`, one thread each.

Same input, same run: the fortunes corpus (Debian's `fortunes`, split into
documents at '%' lines as `weft data prepare` splits it), encoded without
document tokens by

  weft   build/benchmarks/bench_tokenizer (one encoder, one thread)
  HF     Tokenizer.encode_batch_fast(docs, add_special_tokens=False) (no
         offsets; encode_batch where the version lacks it) with
         RAYON_NUM_THREADS=1, its fastest path on one thread

for each tokenizer: the committed Llama-3-style fixture (vocab 1006), one of
the same kind trained here with a 32000 vocab (Llama-3-like merges per word),
and any tokenizer.json passed with --tokenizer. Both sides get one untimed
warm-up pass and report the best of --repeats passes in MB/s of text, timed
in process CPU time (so that other work on a shared machine disturbs the
comparison less; for both sides it equals wall time on an idle machine), and
their ids are compared through a checksum. Without the `tokenizers` package
the HF side is skipped with a message and weft's numbers still print.

    /tmp/tokvenv/bin/python benchmarks/tokenizer_vs_hf.py [--build build] [--tokenizer F]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its thread pool
os.environ["TOKENIZERS_PARALLELISM"] = "false"

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
import tokenizer_fixtures as fixtures  # noqa: E402


def documents(paths):
    """The documents of each file, by weft's rule (data/documents.h)."""
    docs = []
    for path in paths:
        with open(path, "rb") as f:
            docs += fixtures.text_documents(f.read())
    return docs


def checksum(id_lists):
    c = 0
    for ids in id_lists:
        for i in ids:
            c = (c * 1000003 + i) & 0xFFFFFFFFFFFFFFFF
    return c


def hf_side(tokenizer_path, docs, repeats):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    texts = [d.decode("utf-8", errors="replace") for d in docs]
    mb = sum(len(d) for d in docs) / 1e6
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    best = float("inf")
    for rep in range(repeats + 1):
        start = time.process_time()
        encodings = encode(texts, add_special_tokens=False)
        seconds = time.process_time() - start
        if rep > 0:
            best = min(best, seconds)
    return mb / best, checksum(e.ids for e in encodings), sum(len(e.ids) for e in encodings)


def weft_side(build, tokenizer_path, paths, repeats):
    out = subprocess.run([os.path.join(build, "benchmarks", "bench_tokenizer"), tokenizer_path,
                          *paths, "--repeats", str(repeats)], check=True, capture_output=True,
                         text=True).stdout.strip()
    rate = float(out.split(": ", 1)[1].split(" MB/s")[0])
    return rate, int(out.rsplit("checksum ", 1)[1], 16), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--tokenizer", action="append", default=[],
                    help="another tokenizer.json to measure (repeatable)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=32000, help="vocab of the trained tokenizer")
    args = ap.parse_args()

    paths = fixtures.fortune_files(fixtures.FORTUNES_DIR)
    docs = documents(paths)
    print(f"input: {len(paths)} fortune files, {len(docs)} documents, "
          f"{sum(len(d) for d in docs) / 1e6:.2f} MB; one thread per side")

    try:
        import tokenizers
        have_hf = True
    except ImportError:
        have_hf = False
        print("Hugging Face tokenizers is not installed (pip install tokenizers): "
              "the HF side is skipped")

    tokenizers_to_run = [("fixture (vocab 1006)", os.path.join(HERE, "..", "tests", "fixtures",
                                                                "tokenizer_bpe.json"))]
    tmp = tempfile.TemporaryDirectory()
    if have_hf:
        text_docs = [d.decode("utf-8", errors="replace") for d in docs]
        tok, _ = fixtures.train_hf(text_docs, vocab=args.vocab)
        path = os.path.join(tmp.name, "tokenizer.json")
        tok.save(path)
        tokenizers_to_run.append((f"trained here (vocab {tok.get_vocab_size()})", path))
    tokenizers_to_run += [(p, p) for p in args.tokenizer]

    print(f"{'tokenizer':28} {'weft MB/s':>10} {'HF MB/s':>10} {'weft/HF':>8}  ids")
    for name, path in tokenizers_to_run:
        weft_rate, weft_sum, _ = weft_side(args.build, path, paths, args.repeats)
        if not have_hf:
            print(f"{name:28} {weft_rate:10.1f} {'-':>10} {'-':>8}  (HF skipped)")
            continue
        hf_rate, hf_sum, _ = hf_side(path, docs, args.repeats)
        same = "equal" if weft_sum == hf_sum else "DIFFER"
        print(f"{name:28} {weft_rate:10.1f} {hf_rate:10.1f} {weft_rate / hf_rate:8.2f}  {same}")
    if have_hf:
        print(f"tokenizers {tokenizers.__version__}")


if __name__ == "__main__":
    main()
