#!/usr/bin/env bash
# Makes the README's picture from a real dry-run: the HTML page of Llama 3.1
# 8B on 64 H100s at 8,192 tokens, rendered by headless Chromium.
#   tools/docs_picture.sh [OUT.png]   (default docs/images/dry-run.png)
set -euo pipefail
repo="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
out="${1:-$repo/docs/images/dry-run.png}"
weft="${WEFT:-$repo/build/weft}"
browser=""
for b in chromium chromium-browser google-chrome google-chrome-stable; do
  command -v "$b" >/dev/null 2>&1 && { browser="$b"; break; }
done
[ -n "$browser" ] || { echo "docs_picture: no Chromium (apt-get install chromium; tools/setup.sh does)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$weft" tune --dry-run --model llama3.1-8b --gpu h100 --gpus 64 --seq 8192 --format html --out "$work/space.html"
mkdir -p "$(dirname "$out")"
# The first screen of the page: the header and the plot of every layout.
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$work/profile" \
  --window-size=1200,820 --screenshot="$out" "file://$work/space.html" 2>/dev/null
[ -s "$out" ] || { echo "docs_picture: $browser wrote no screenshot" >&2; exit 1; }
echo "docs_picture: wrote $out"
