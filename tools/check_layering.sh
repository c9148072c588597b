#!/usr/bin/env bash
# The layering of weft, checked from the source: every #include "..." of a
# library file must name a header of its own layer or one below it, and no
# library code below cli/ may end the process (exit, quick_exit, abort):
# it throws typed errors and cli/ decides the exit status. The one kind of
# exception, a process that must end because it cannot go on (a watchdog over
# a hung collective), says why on the line before: `// layering-ok: <why>`.
#
#   tools/check_layering.sh           # the checkout this script lives in
#   tools/check_layering.sh DIR       # another tree (the test runs it on a copy)
#
# The layers, lowest first (docs/ARCHITECTURE.md says what each one holds).
# A folder listed with a parent's prefix (trainer/checkpoint) is a layer of
# its own below its parent. Folders outside the list (tests, benchmarks,
# tools) sit above everything and are not checked.
set -euo pipefail
layers=(core kernels memory data trainer/checkpoint trainer tuner calibration report cli)

root=${1:-"$(cd "$(dirname "$0")/.." && pwd)"}
cd "$root"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && [ "$(git rev-parse --show-toplevel)" = "$PWD" ]; then
  list_files() { git ls-files -co --exclude-standard -- "$@"; }
else
  list_files() { find "$@" -type f 2>/dev/null | sed 's|^\./||'; }
fi

tops=()
for l in "${layers[@]}"; do
  t=${l%%/*}
  [[ " ${tops[*]} " == *" $t "* ]] || tops+=("$t")
done
mapfile -t files < <(for t in "${tops[@]}"; do [ -d "$t" ] && list_files "$t"; done |
                     grep -E '\.(c|cc|cpp|h|hpp|cu|cuh)$' | sort -u)
if [ ${#files[@]} -eq 0 ]; then
  echo "check_layering: no source files under ${tops[*]} in $root" >&2
  exit 2
fi

awk -v order="${layers[*]}" '
  BEGIN {
    n = split(order, name, " ")
    for (i = 1; i <= n; i++) rank[name[i]] = i
    chain = name[1]; for (i = 2; i <= n; i++) chain = chain " <- " name[i]
  }
  # The layer of a path: its longest listed prefix, or "" when none.
  function layer_of(p,    best, i) {
    best = ""
    for (i = 1; i <= n; i++)
      if ((p == name[i] || index(p, name[i] "/") == 1) && length(name[i]) > length(best)) best = name[i]
    return best
  }
  # "../x.h" and "./x.h" against the including file'"'"'s folder.
  function resolve(dir, inc,    parts, k, i, out, m) {
    if (inc !~ /^\.\.?\//) return inc
    m = split(dir "/" inc, parts, "/"); k = 0
    for (i = 1; i <= m; i++) {
      if (parts[i] == "" || parts[i] == ".") continue
      if (parts[i] == "..") { if (k > 0) k--; continue }
      out[++k] = parts[i]
    }
    inc = ""; for (i = 1; i <= k; i++) inc = inc (i > 1 ? "/" : "") out[i]
    return inc
  }
  FNR == 1 {
    own = layer_of(FILENAME); dir = FILENAME; sub(/\/[^\/]*$/, "", dir)
    in_block = 0; filecount++
  }
  {
    before = prev; prev = $0; line = $0
    # Comments are not code: drop block comments, line comments and strings
    # before looking for calls (includes are read from the raw line).
    if (in_block) { if (sub(/^.*\*\//, "", line)) in_block = 0; else next }
    while (match(line, /\/\*/)) {
      rest = substr(line, RSTART + 2)
      if (match(rest, /\*\//)) line = substr(line, 1, RSTART - 1) " " substr(rest, RSTART + 2)
      else { line = substr(line, 1, RSTART - 1); in_block = 1; break }
    }
  }
  $0 ~ /^[ \t]*#[ \t]*include[ \t]*"/ {
    inc = $0; sub(/^[^"]*"/, "", inc); sub(/".*$/, "", inc)
    target = resolve(dir, inc)
    if (index(target, "/") == 0) next   # a header beside its file, or generated
    tl = layer_of(target)
    if (tl == "") {
      top = target; sub(/\/.*$/, "", top)
      if (top !~ /^(tests|benchmarks|tools)$/) next   # a library of the system or build tree
      tl = top; trank = n + 1
    } else trank = rank[tl]
    if (trank > rank[own]) {
      printf "%s:%d: includes \"%s\": %s may not include %s (it is above it)\n", FILENAME, FNR, inc, own, tl
      bad++
    }
    next
  }
  own != "cli" && before !~ /layering-ok: [^ ]/ {
    code = line; sub(/\/\/.*$/, "", code); gsub(/"([^"\\]|\\.)*"/, "\"\"", code)
    if (code ~ /(^|[^A-Za-z0-9_.>:]|std::)(exit|_exit|_Exit|quick_exit|abort)[ \t]*\(/) {
      printf "%s:%d: ends the process: only cli/ may; library code throws a typed error (core/error.h)\n", FILENAME, FNR
      bad++
    }
  }
  END {
    if (bad) {
      printf "check_layering: %d violation%s of %s\n", bad, bad == 1 ? "" : "s", chain > "/dev/stderr"
      exit 1
    }
    printf "check_layering: %d files keep %s\n", filecount, chain
  }
' "${files[@]}"
