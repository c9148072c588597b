#!/usr/bin/env python3
"""Write PyTorch's FP8 casts of a set of float32 values to
tests/fixtures/fp8_torch.bin, the reference weft's fp8_encode and
fp8_quantize are tested against bit for bit (tests/unit/kernels/test_fp8.cpp).
CI does not run this script; the fixture is committed. To regenerate:

    pip install torch
    python3 tools/fp8_fixtures.py           # writes the fixture
    python3 tools/fp8_fixtures.py --check   # regenerates in memory, compares bytes

Inputs: every E4M3 and E5M2 value, the midpoints between neighbouring values
(exact ties) and one float32 ulp either side of each, the values around both
formats' max and smallest subnormal, +-0, +-inf, +-NaN, float32 subnormals
and FLT_MAX, then 20,000 values with log-uniform magnitudes in
[2^-24, 2^20] and random signs (seed 2026).

File (little-endian):
    char[8]  "WEFTFP8\\0"
    u32      n
    f32[n]   inputs
    u8[n]    x.to(torch.float8_e4m3fn) bits
    u8[n]    x.to(torch.float8_e5m2) bits
    f32      scale (3.7)
    u8[n]    (x * scale).clamp(-448, 448).to(float8_e4m3fn) bits
    u8[n]    (x * scale).clamp(-57344, 57344).to(float8_e5m2) bits
"""
import struct
import sys
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "fp8_torch.bin"
SCALE = 3.7


def ulp_neighbours(values):
    t = torch.tensor(values, dtype=torch.float32)
    up = torch.nextafter(t, torch.full_like(t, float("inf")))
    down = torch.nextafter(t, torch.full_like(t, float("-inf")))
    return torch.cat([t, up, down])


def inputs():
    parts = []
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        codes = torch.arange(256, dtype=torch.uint8).view(dtype).to(torch.float32)
        finite = codes[torch.isfinite(codes)]
        finite = torch.unique(finite)  # sorted
        mids = (finite[1:].double() + finite[:-1].double()) / 2
        parts.append(ulp_neighbours(finite.tolist()))
        parts.append(ulp_neighbours(mids.float().tolist()))
    specials = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan"),
                1e-45, -1e-45, 1.17549435e-38, 3.4028235e38, -3.4028235e38,
                448.0, 464.0, 480.0, 57344.0, 61440.0, 65536.0, 2.0**-9, 2.0**-10, 2.0**-16, 2.0**-17]
    parts.append(ulp_neighbours(specials))
    g = torch.Generator().manual_seed(2026)
    mag = torch.exp2(torch.empty(20000, dtype=torch.float64).uniform_(-24, 20, generator=g))
    sign = torch.where(torch.rand(20000, generator=g) < 0.5, -1.0, 1.0).double()
    parts.append((mag * sign).float())
    return torch.cat(parts)


def serialize():
    x = inputs()
    n = x.numel()
    e4 = x.to(torch.float8_e4m3fn).view(torch.uint8)
    e5 = x.to(torch.float8_e5m2).view(torch.uint8)
    s = torch.tensor(SCALE, dtype=torch.float32)
    q4 = (x * s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    q5 = (x * s).clamp(-57344.0, 57344.0).to(torch.float8_e5m2).view(torch.uint8)
    out = bytearray(b"WEFTFP8\0")
    out += struct.pack("<I", n)
    out += struct.pack(f"<{n}f", *x.tolist())
    for t in (e4, e5):
        out += bytes(t.tolist())
    out += struct.pack("<f", SCALE)
    for t in (q4, q5):
        out += bytes(t.tolist())
    return bytes(out)


def main():
    data = serialize()
    if "--check" in sys.argv:
        if OUT.read_bytes() != data:
            sys.exit(f"{OUT} differs from what torch {torch.__version__} writes")
        print(f"{OUT.name}: identical ({len(data)} bytes)")
        return
    OUT.write_bytes(data)
    print(f"wrote {OUT} ({len(data)} bytes, torch {torch.__version__})")


if __name__ == "__main__":
    main()
