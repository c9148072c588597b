#!/usr/bin/env python3
"""Reads a folder of TensorBoard event files with the tensorboard package, as
the TensorBoard server loads them (plugin_event_accumulator, the events at and
after each session start's step dropped from earlier files), and prints what
it holds as JSON:

    {"files": N, "records": N, "scalars": {tag: [[step, value], ...]},
     "texts": {tag: [[step, text], ...]}}

Values are printed with Python's repr, so a double reads back bit for bit.
Before loading, every record of every file is checked against its TFRecord
framing: the masked CRC32C of the length and of the data, with tensorboard's
own checksum function. Exit status 2 (and a message) when the package is
missing or a record is damaged.

    python3 tests/e2e/tensorboard_dump.py DIR
"""
import json
import os
import struct
import sys


def check_framing(path, masked_crc32c):
    records = 0
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        if at + 12 > len(data):
            raise ValueError(f"{path}: a truncated header at byte {at}")
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if len_crc != masked_crc32c(header):
            raise ValueError(f"{path}: record {records}: the length's checksum does not match")
        body = data[at + 12:at + 12 + length]
        if len(body) != length or at + 16 + length > len(data):
            raise ValueError(f"{path}: record {records}: truncated")
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if body_crc != masked_crc32c(body):
            raise ValueError(f"{path}: record {records}: the data's checksum does not match")
        at += 16 + length
        records += 1
    return records


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    folder = sys.argv[1]
    try:
        from tensorboard.backend.event_processing import plugin_event_accumulator as ea
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
        from tensorboard.util import tensor_util
    except ImportError as e:
        print(f"tensorboard_dump: the tensorboard package is missing ({e}); pip install tensorboard",
              file=sys.stderr)
        return 2
    files = sorted(f for f in os.listdir(folder) if f.startswith("events.out.tfevents."))
    records = 0
    try:
        for f in files:
            records += check_framing(os.path.join(folder, f), masked_crc32c)
    except ValueError as e:
        print(f"tensorboard_dump: {e}", file=sys.stderr)
        return 2
    acc = ea.EventAccumulator(folder, size_guidance={ea.TENSORS: 0}, purge_orphaned_data=True)
    acc.Reload()
    scalars, texts = {}, {}
    for tag in acc.Tags()["tensors"]:
        plugin = acc.SummaryMetadata(tag).plugin_data.plugin_name
        for e in acc.Tensors(tag):
            v = tensor_util.make_ndarray(e.tensor_proto)
            if plugin == "text":
                texts.setdefault(tag, []).append([e.step, v.item().decode("utf-8")])
            else:
                scalars.setdefault(tag, []).append([e.step, v.item()])
    json.dump({"files": len(files), "records": records, "scalars": scalars, "texts": texts}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
