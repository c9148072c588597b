#!/usr/bin/env python3
"""Write the reference fixtures for weft's tokenizers (`weft data prepare --tokenizer`).

The reference libraries, Hugging Face `tokenizers` and `sentencepiece`, train
two small tokenizers on the text of Debian's `fortunes` package and encode a
set of texts; weft's encoders must give the same ids, token for token. CI does
not run this script: the fixtures are committed and the C++ tests read them.
To regenerate:

    apt-get install fortunes
    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers sentencepiece
    /tmp/tokvenv/bin/python tools/tokenizer_fixtures.py          # writes tests/fixtures/
    /tmp/tokvenv/bin/python tools/tokenizer_fixtures.py --check  # regenerates, compares

Fixtures
--------
tokenizer_bpe.json     a Llama-3-style byte-level BPE tokenizer.json: Llama 3's
                       pre-tokenizer regex (Split, isolated) then ByteLevel
                       without its regex, a BPE model with ignore_merges,
                       a ByteLevel decoder, and a post-processor that puts
                       <|begin_of_text|> before each sequence. Vocab 1000
                       learned, plus Llama 3's first special tokens after it
                       (as Llama 3 numbers them, above the learned vocab) and
                       one non-special added token.
tokenizer_sp.model     a Llama-2-style SentencePiece BPE model: byte fallback,
                       split digits, identity normalization, a dummy prefix,
                       whitespace-only pieces allowed; vocab 1000.
tokenizer_cases.json   the texts and their ids:
    {"format": "weft-tokenizer-cases", "version": 1,
     "generator": {...versions...},
     "hf": {"file", "bos", "eos"},    bos/eos: what the post-processor adds
     "sp": {"file", "bos", "eos"},    the model's ids (-1: none)
     "cases": [{"name", "text" | "hex", "hf": [ids], "sp": [ids]}]}
    A case holds "text" when its bytes are valid UTF-8, else "hex" (its bytes
    in hex). "hf" is Tokenizer.encode(text).ids, the post-processor applied
    (so BOS first). "sp" is SentencePieceProcessor.encode(text), without BOS
    or EOS. Bytes that are not valid UTF-8 are first decoded with Python's
    errors="replace" (one U+FFFD per maximal invalid subpart, as Rust's
    String::from_utf8_lossy does), which is what weft promises to do.
"""

import argparse
import base64
import io
import json
import os
import sys

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
ADDED_TOKEN = "[[weft]]"  # a non-special added token
VOCAB = 1000
FORTUNES_DIR = "/usr/share/games/fortunes"
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")


def fortune_files(root):
    """The fortune text files, chosen as data/corpus.cpp chooses them."""
    names = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        if name.startswith(".") or name.endswith(".dat") or name.endswith(".u8"):
            continue
        names.append(path)
    if not names:
        sys.exit(f"no fortune files in {root}: apt-get install fortunes")
    return names


def text_documents(data):
    """A text file's documents as weft splits them (data/documents.h):
    a line holding only "%" (lines end at "\\n" only) ends a document, which
    keeps its bytes, separator included."""
    docs, doc_start, line_start = [], 0, 0
    while line_start < len(data):
        nl = data.find(b"\n", line_start)
        line_end = len(data) if nl < 0 else nl
        following = len(data) if nl < 0 else nl + 1
        if data[line_start:line_end] in (b"%", b"%\r"):
            docs.append(data[doc_start:following])
            doc_start = following
        line_start = following
    if doc_start < len(data):
        docs.append(data[doc_start:])
    return docs


def fortune_documents(root):
    return [d.decode("utf-8", errors="replace")
            for path in fortune_files(root) for d in text_documents(open(path, "rb").read())]


def train_hf(docs, vocab=VOCAB):
    """A Llama-3-style byte-level BPE trained on `docs`; returns it and its BOS id."""
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers,
                            processors, trainers)

    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.add_tokens([AddedToken(ADDED_TOKEN, normalized=False)])
    bos = SPECIAL_TOKENS[0]
    bos_id = tok.token_to_id(bos)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1",
                                      special_tokens=[(bos, bos_id)]),
    ])
    return tok, bos_id


def train_sp(docs):
    import sentencepiece as spm

    lines = [line for d in docs for line in d.splitlines() if line.strip() and line != "%"]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=VOCAB, model_type="bpe",
        byte_fallback=True, split_digits=True, normalization_rule_name="identity",
        add_dummy_prefix=True, remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        character_coverage=0.99995, num_threads=1, minloglevel=2)
    return model.getvalue()


def cases(docs):
    """(name, bytes) pairs: fortune samples, then edge cases."""
    out = []
    step = max(1, len(docs) // 30)
    for i in range(0, len(docs), step)[:30]:
        out.append((f"fortune {i}", docs[i].encode()))
    long_word = "pneumonoultramicroscopicsilicovolcanoconiosis" * 8
    edge = {
        "empty": "",
        "one space": " ",
        "emoji": "Good morning 🌍🌞! Family: 👨‍👩‍👧‍👦, flags 🇫🇷🇯🇵, skin 👍🏽.",
        "CJK": "東京は日本の首都です。我爱自然语言处理。한국어 텍스트도 있습니다.",
        "combining marks": "e\u0301le\u0300ve, n\u0303, a\u030a\u0327, Z\u0335\u0321a\u0336lgo",
        "spaces tabs newlines": "a  b   c\t\td \t e\n\nf\r\n\r\ng \n \n  \n\t\n   ",
        "digits and long numbers": "1 12 123 1234 12345 3.14159265358979 1,000,000 2024-05-01 "
                                   "0x7fffffff 98765432109876543210",
        "very long word": long_word,
        "long run of one character": "a" * 300 + " " + "=" * 200,
        "leading and trailing whitespace": "   \t hello world \n\n  ",
        "only newlines": "\n\n\n",
        "contractions": "I'm sure you'll see they'd've DON'T it's We'RE O'Neil's",
        "punctuation runs": "Wait... what?!?! (yes) [no] {maybe} <<<>>> --- ___ ***\n",
        "special tokens inside text": "<|begin_of_text|>Hello<|eot_id|> world <|start_header_id|>"
                                      "user<|end_header_id|>\n\nhi<|end_of_text|>",
        "special token split by spaces": "a <|eot_id|> b<|eot_id|>c <|eot_id|\n<|eot",
        "added token": "see [[weft]] and [[weft]][[weft]] or [[ weft ]]",
        "mixed scripts": "Ελληνικά Русский עברית العربية हिन्दी ไทย",
        "unicode spaces": "a\u00a0b\u2003c\u3000d\u2028e\u0085f\u200bg",
        "control characters": "a\x00b\x01c\x7fd\x1be",
        "apostrophes": "rock'n'roll '' ' 's 'S ’s",
        "code": "def f(x):\n    return x**2  # square\n\nif __name__ == '__main__':\n\tf(3)\n",
        "url and email": "https://example.com/path?q=1&r=two#frag mail@example.org",
    }
    for name, text in edge.items():
        out.append((name, text.encode()))
    invalid = {
        "invalid: lone continuation byte": b"abc\x80def",
        "invalid: truncated sequence": b"caf\xc3 ok \xe2\x82 end",
        "invalid: overlong and surrogate": b"x\xc0\xafy\xed\xa0\x80z",
        "invalid: bytes ff fe": b"\xff\xfehello\xfe",
        "invalid: truncated at end": b"tail \xf0\x9f\x8c",
        "invalid: beyond U+10FFFF": b"q\xf4\x90\x80\x80r",
    }
    out.extend(invalid.items())
    return out


def generate():
    import sentencepiece as spm
    import tokenizers

    docs = fortune_documents(FORTUNES_DIR)
    hf, bos_id = train_hf(docs)
    sp_bytes = train_sp(docs)
    sp = spm.SentencePieceProcessor(model_proto=sp_bytes)

    hf_json = json.loads(hf.to_str())
    files = {"tokenizer_bpe.json": (json.dumps(hf_json, ensure_ascii=False, indent=None,
                                               separators=(",", ":")) + "\n").encode(),
             "tokenizer_sp.model": sp_bytes}
    table = []
    for name, raw in cases(docs):
        text = raw.decode("utf-8", errors="replace")
        case = {"name": name}
        try:
            case["text"] = raw.decode("utf-8")
        except UnicodeDecodeError:
            case["hex"] = raw.hex()
        case["hf"] = hf.encode(text).ids
        case["sp"] = sp.encode(text)
        table.append(case)
    doc = {
        "format": "weft-tokenizer-cases",
        "version": 1,
        "generator": {"script": "tools/tokenizer_fixtures.py", "tokenizers": tokenizers.__version__,
                      "sentencepiece": spm.__version__, "python": sys.version.split()[0]},
        "hf": {"file": "tokenizer_bpe.json", "bos": bos_id, "eos": None},
        "sp": {"file": "tokenizer_sp.model", "bos": sp.bos_id(), "eos": sp.eos_id()},
        "cases": table,
    }
    # One case per line keeps diffs of a regenerated table readable.
    lines = [json.dumps({k: v for k, v in doc.items() if k != "cases"}, ensure_ascii=False)[:-1]
             + ', "cases": [']
    lines += [json.dumps(c, ensure_ascii=False, separators=(",", ":")) + ("," if i + 1 < len(table)
                                                                          else "")
              for i, c in enumerate(table)]
    lines.append("]}")
    files["tokenizer_cases.json"] = ("\n".join(lines) + "\n").encode()
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="regenerate in memory and compare with the committed fixtures")
    ap.add_argument("--out", default=FIXTURES, help="fixture folder (default tests/fixtures)")
    args = ap.parse_args()
    files = generate()
    if args.check:
        bad = []
        for name, data in files.items():
            path = os.path.join(args.out, name)
            if not os.path.exists(path) or open(path, "rb").read() != data:
                bad.append(name)
        if bad:
            sys.exit(f"differs from the committed fixtures: {', '.join(bad)}")
        print("fixtures match")
        return
    os.makedirs(args.out, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(data)
        print(f"wrote {os.path.join(args.out, name)} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
