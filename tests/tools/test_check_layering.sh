#!/usr/bin/env bash
# tools/check_layering.sh passes on this tree, and fails on a copy of it with
# one upward include, or with a library call that ends the process, naming
# the file and line; the `layering-ok:` note lets a reasoned exit through.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
check=$root/tools/check_layering.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$check" "$root" >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "the tree itself breaks its layering"; }
grep -q "files keep core" "$tmp/out" || fail "no summary line: $(cat "$tmp/out")"

for d in core kernels memory data trainer tuner calibration report cli; do
  [ -d "$root/$d" ] && cp -r "$root/$d" "$tmp/$d"
done
"$check" "$tmp" >/dev/null 2>&1 || fail "the copy should pass before it is changed"

# An upward include: a kernel including the tuner.
victim=kernels/gemm/gemm.h
cp "$tmp/$victim" "$tmp/keep"
printf '#include "tuner/space.h"\n' >>"$tmp/$victim"
if "$check" "$tmp" >"$tmp/out" 2>&1; then fail "an upward include passed"; fi
grep -q "^$victim:[0-9]*: includes \"tuner/space.h\": kernels may not include tuner" "$tmp/out" ||
  fail "the upward include is not named: $(cat "$tmp/out")"
cp "$tmp/keep" "$tmp/$victim"

# A relative include that climbs into a higher layer.
printf '#include "../../cli/options.h"\n' >>"$tmp/$victim"
if "$check" "$tmp" >"$tmp/out" 2>&1; then fail "a relative upward include passed"; fi
grep -q "kernels may not include cli" "$tmp/out" || fail "relative include not resolved: $(cat "$tmp/out")"
cp "$tmp/keep" "$tmp/$victim"

# A library that ends the process, then the same call with its reason.
f=memory/estimate.cpp
cp "$tmp/$f" "$tmp/keep"
printf 'void weft_layering_probe() { std::exit(3); }\n' >>"$tmp/$f"
if "$check" "$tmp" >"$tmp/out" 2>&1; then fail "exit() below cli passed"; fi
grep -q "^$f:[0-9]*: ends the process" "$tmp/out" || fail "exit() not named: $(cat "$tmp/out")"
cp "$tmp/keep" "$tmp/$f"
printf '// layering-ok: a probe of the checker\nvoid weft_layering_probe() { std::exit(3); }\n' >>"$tmp/$f"
"$check" "$tmp" >"$tmp/out" 2>&1 || fail "a reasoned exit was refused: $(cat "$tmp/out")"
# A call in a comment or a string is not a call.
printf '// we never exit(1) here\nconst char* weft_probe_text = "abort()";\n' >>"$tmp/$f"
"$check" "$tmp" >"$tmp/out" 2>&1 || fail "a comment or string counted as a call: $(cat "$tmp/out")"
echo "check_layering: passes on the tree, fails on upward includes and exits"
