#!/usr/bin/env python3
"""Megatron-LM indexed datasets (.bin/.idx) with numpy alone, for checking weft.

Written from the published format (megatron/core/datasets/indexed_dataset.py),
without importing Megatron, so that weft's reader and writer are checked
against an independent implementation:

  .idx  magic b"MMIDIDX\\x00\\x00", version <Q = 1, dtype code <B,
        sequence count <Q, document index entries <Q (documents + 1),
        sequence lengths <i4[S], sequence byte offsets <i8[S],
        document index <i8[D] (0, ..., S)
  .bin  the tokens of every sequence, back to back

  python3 tools/megatron_data.py fixtures [DIR]   # writes tests/fixtures/megatron_*
  python3 tools/megatron_data.py verify PREFIX [--expect FILE.json]
                                                   # reads a dataset (weft's
                                                   # `data prepare --format megatron`
                                                   # output, say) and checks it

A fixture is PREFIX.bin, PREFIX.idx and PREFIX.json, the tokens it should
hold: {"dtype": ..., "documents": [[sequence, ...], ...]}, each sequence a
list of token ids.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
         6: np.float64, 7: np.float32, 8: np.uint16}
HEADER_BYTES = 9 + 8 + 1 + 8 + 8


def code_of(dtype):
    for code, t in CODES.items():
        if np.dtype(t) == np.dtype(dtype):
            return code
    raise ValueError(f"no Megatron dtype code for {dtype}")


def write(prefix, documents, dtype):
    """documents: a list of documents, each a list of sequences of ids."""
    lengths, offsets, doc_index = [], [], [0]
    offset = 0
    itemsize = np.dtype(dtype).itemsize
    with open(prefix + ".bin", "wb") as f:
        for doc in documents:
            for seq in doc:
                a = np.asarray(seq, dtype=dtype)
                assert np.array_equal(a.astype(np.int64), np.asarray(seq, dtype=np.int64)), \
                    f"ids {seq} do not fit {np.dtype(dtype).name}"
                f.write(a.astype(np.dtype(dtype).newbyteorder("<")).tobytes())
                lengths.append(len(seq))
                offsets.append(offset)
                offset += len(seq) * itemsize
            doc_index.append(len(lengths))
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", VERSION))
        f.write(struct.pack("<B", code_of(dtype)))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_index)))
        f.write(np.asarray(lengths, dtype="<i4").tobytes())
        f.write(np.asarray(offsets, dtype="<i8").tobytes())
        f.write(np.asarray(doc_index, dtype="<i8").tobytes())
    with open(prefix + ".json", "w") as f:
        json.dump({"dtype": np.dtype(dtype).name, "documents": documents}, f)
        f.write("\n")


def read(prefix):
    """The documents of a dataset, checking every rule of the format on the way."""
    idx = open(prefix + ".idx", "rb").read()
    if idx[:9] != MAGIC:
        raise ValueError(f"{prefix}.idx: bad magic {idx[:9]!r}")
    version, = struct.unpack_from("<Q", idx, 9)
    code, = struct.unpack_from("<B", idx, 17)
    s, d = struct.unpack_from("<QQ", idx, 18)
    if version != VERSION:
        raise ValueError(f"{prefix}.idx: version {version}")
    if code not in CODES:
        raise ValueError(f"{prefix}.idx: unknown dtype code {code}")
    if len(idx) != HEADER_BYTES + 12 * s + 8 * d:
        raise ValueError(f"{prefix}.idx: {len(idx)} bytes for {s} sequences, {d} entries")
    dtype = np.dtype(CODES[code]).newbyteorder("<")
    lengths = np.frombuffer(idx, "<i4", s, HEADER_BYTES)
    offsets = np.frombuffer(idx, "<i8", s, HEADER_BYTES + 4 * s)
    doc_index = np.frombuffer(idx, "<i8", d, HEADER_BYTES + 12 * s)
    if d < 1 or doc_index[0] != 0 or doc_index[-1] != s or np.any(np.diff(doc_index) < 0):
        raise ValueError(f"{prefix}.idx: bad document index {doc_index.tolist()}")
    data = np.fromfile(prefix + ".bin", dtype=np.uint8)
    expected = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * dtype.itemsize)])
    if not np.array_equal(offsets, expected[:-1]) or expected[-1] != data.size:
        raise ValueError(f"{prefix}: offsets {offsets.tolist()} and lengths do not tile the "
                         f"{data.size}-byte .bin")
    seqs = [np.frombuffer(data.tobytes(), dtype, int(n), int(o)).astype(np.int64).tolist()
            for n, o in zip(lengths, offsets)]
    docs = [seqs[doc_index[i]:doc_index[i + 1]] for i in range(d - 1)]
    return np.dtype(CODES[code]).name, docs


def fixtures(out):
    """Tiny datasets for tests/unit/data/test_megatron.cpp."""
    # uint16, as preprocess_data writes for vocabs below 65500; the second
    # document holds two sequences (sentence splitting), the third none.
    write(os.path.join(out, "megatron_u16"),
          [[[5, 6, 7, 8, 9]], [[10, 11, 12], [13, 14]], [], [[65535, 0, 1, 2, 3, 4, 255, 256]]],
          np.uint16)
    # int32, for vocabs above 65535: ids past the uint16 range.
    write(os.path.join(out, "megatron_i32"),
          [[[70000, 1, 2]], [[128255, 3, 4, 5, 6, 7]], [[65536]]], np.int32)
    # The other integer codes weft reads.
    write(os.path.join(out, "megatron_u8"), [[[1, 2, 3, 250]], [[4, 5]]], np.uint8)
    write(os.path.join(out, "megatron_i64"), [[[3, 1, 4, 1, 5, 9, 2, 6]]], np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fixtures", help="write the test fixtures")
    f.add_argument("out", nargs="?", default=os.path.join(os.path.dirname(__file__), "..",
                                                          "tests", "fixtures"))
    v = sub.add_parser("verify", help="read a dataset and check it")
    v.add_argument("prefix")
    v.add_argument("--expect", help="a fixture .json whose tokens the dataset must hold")
    v.add_argument("--tokens", help="a file whose bytes the dataset's tokens must be, in order "
                                    "(for byte-tokenized text)")
    a = ap.parse_args()
    if a.cmd == "fixtures":
        os.makedirs(a.out, exist_ok=True)
        fixtures(a.out)
        return 0
    dtype, docs = read(a.prefix)
    n = sum(len(s) for d in docs for s in d)
    print(f"{a.prefix}: {dtype}, {n} tokens, {sum(len(d) for d in docs)} sequences, "
          f"{len(docs)} documents")
    if a.expect:
        want = json.load(open(a.expect))
        if want["dtype"] != dtype or want["documents"] != docs:
            print(f"differs from {a.expect}", file=sys.stderr)
            return 1
        print(f"matches {a.expect}")
    if a.tokens:
        got = [t for d in docs for s in d for t in s]
        want = list(open(a.tokens, "rb").read())
        if got != want:
            print(f"tokens differ from the bytes of {a.tokens}", file=sys.stderr)
            return 1
        print(f"tokens are the bytes of {a.tokens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
