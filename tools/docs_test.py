#!/usr/bin/env python3
"""Runs the shell examples of README.md and docs/*.md, and checks the docs' shape.

Markup:
  * Every fenced block names its language. A ```sh block is a runnable
    example: it is run, in page order, with bash -euo pipefail, in a scratch
    folder of its own page (build/, tools/, tests/, benchmarks/, recipes/,
    calibration/, docs/ and README.md there are links to the repository's).
    A sh block whose first line is "# not run in CI: <why>" is skipped, and
    says so to the reader.
    Commands (./build/..., mpirun, tools/..., python3 ...) outside a sh block
    are an error, so no example escapes the run.
  * An HTML comment on the line before a fence sets options:
      <!-- docs-test: timeout=300 time=205 within=2 exit=2 -->
    timeout: seconds before the block is killed (default 120); time: the wall
    seconds the page states for the block, held within a factor `within`
    (default 2) of the measured time; exit: the expected exit code (default 0;
    a block with another one needs an output block, so that it fails for the
    reason the page says).
  * A ```text block after a sh block, with <!-- docs-test: output --> before
    it, is what the sh block prints: each of its lines must match an output
    line, in order (other output lines may come between). Numbers match
    within 2% (numbers=PCT), a number followed by s, ms, tok/s or tokens/s
    within a factor of 2 (times=F), and "…" stands for any text.
  * README.md has at most 150 lines, and its first two sh blocks (the quick
    start's two commands) start within its first 30 lines.

Usage: tools/docs_test.py [--lint-only] [--page README.md] [--keep DIR]
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

COMMAND = re.compile(r"^\s*(\./build/|build/|mpirun |tools/|python3 |sbatch |weft )")
NOT_RUN = re.compile(r"^# not run in CI: \S")
OPTION = re.compile(r"^<!-- docs-test:(.*)-->\s*$")
NUMBER = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
TIME_UNIT = re.compile(r"^\s?(s|ms|tok/s|tokens/s)\b")
LINKED = ["build", "tools", "tests", "benchmarks", "recipes", "calibration", "docs", "README.md"]


class Block:
    def __init__(self, page, line, lang, text, options):
        self.page, self.line, self.lang, self.text, self.options = page, line, lang, text, options

    def where(self):
        return f"{self.page}:{self.line}"


def parse_options(raw):
    options = {}
    for item in raw.split():
        key, _, value = item.partition("=")
        options[key] = value if value else "1"
    return options


def read_blocks(path, page):
    """The fenced blocks of a Markdown file, with the options before each."""
    blocks, errors = [], []
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        fence = re.match(r"^(\s*)(`{3,})(.*)$", lines[i])
        if not fence:
            i += 1
            continue
        indent, ticks, lang = fence.group(1), fence.group(2), fence.group(3).strip()
        start = i + 1
        options = {}
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0 and OPTION.match(lines[j].strip()):
            options = parse_options(OPTION.match(lines[j].strip()).group(1))
        body = []
        i += 1
        while i < len(lines) and not re.match(r"^\s*" + ticks + r"\s*$", lines[i]):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i == len(lines):
            errors.append(f"{page}:{start}: the block is never closed")
        i += 1
        if not lang:
            errors.append(f"{page}:{start}: the block names no language (sh, text, json, ...)")
        if lang != "sh":
            for k, line in enumerate(body):
                if COMMAND.match(line):
                    errors.append(f"{page}:{start + 1 + k}: a command outside a sh block "
                                  f"(runnable examples are ```sh): {line.strip()}")
        blocks.append(Block(page, start, lang, "\n".join(body), options))
    return blocks, errors


def lint(repo, pages):
    errors = []
    parsed = {}
    for page in pages:
        blocks, page_errors = read_blocks(os.path.join(repo, page), page)
        parsed[page] = blocks
        errors += page_errors
        for k, b in enumerate(blocks):
            unknown = set(b.options) - {"timeout", "time", "within", "exit", "output", "numbers", "times"}
            if unknown:
                errors.append(f"{b.where()}: unknown docs-test option(s) {sorted(unknown)}")
            if "output" in b.options and (b.lang != "text" or k == 0 or blocks[k - 1].lang != "sh"):
                errors.append(f"{b.where()}: an output block is a ```text block right after a ```sh block")
            if b.lang == "sh" and b.options.get("exit", "0") != "0" and not (
                    k + 1 < len(blocks) and "output" in blocks[k + 1].options):
                errors.append(f"{b.where()}: a block expected to fail needs an output block after it "
                              "(else any refusal, a misspelt flag's too, would pass)")
            first = b.text.split("\n", 1)[0]
            if b.lang == "sh" and first.startswith("# not run") and not NOT_RUN.match(first):
                errors.append(f"{b.where()}: write a skipped block's first line as '# not run in CI: <why>'")
    readme = open(os.path.join(repo, "README.md"), encoding="utf-8").read().split("\n")
    if readme and readme[-1] == "":
        readme.pop()
    if len(readme) > 150:
        errors.append(f"README.md: {len(readme)} lines; the limit is 150 (the depth goes to docs/)")
    commands = [b for b in parsed.get("README.md", []) if b.lang == "sh"]
    if len(commands) < 2 or commands[1].line > 30:
        errors.append("README.md: the quick start's two commands (its first two sh blocks: the tests and "
                      "the main job) must start within its first 30 lines")
    return parsed, errors


def expected_pattern(line):
    """A regex for one expected output line, and per number its tolerance kind."""
    def literal(text):
        return r"\s+".join(re.escape(word) for word in re.split(r"\s+", text))

    parts, kinds, pos = [], [], 0
    for m in re.finditer(NUMBER + "|…", line):
        parts.append(literal(line[pos:m.start()]))
        if m.group(0) == "…":
            parts.append(".*?")
        else:
            parts.append("(" + NUMBER + ")")
            kinds.append(("time" if TIME_UNIT.match(line[m.end():]) else "number", float(m.group(0))))
        pos = m.end()
    parts.append(literal(line[pos:]))
    pattern = "".join(parts)
    return re.compile(r"\s*" + pattern + r"\s*"), kinds


def numbers_match(kinds, got, numbers_tol, times_factor):
    for (kind, want), text in zip(kinds, got):
        value = float(text)
        if kind == "time":
            if want == 0 or value == 0:
                if want != value:
                    return False
            elif not (want / times_factor <= value <= want * times_factor):
                return False
        elif abs(value - want) > numbers_tol * abs(want) + 1e-12:
            return False
    return True


def check_output(expected_block, output):
    """'' when every expected line matches an output line in order, else why not."""
    numbers_tol = float(expected_block.options.get("numbers", "2%").rstrip("%")) / 100
    times_factor = float(expected_block.options.get("times", "2"))
    got_lines = output.split("\n")
    at = 0
    for want in expected_block.text.split("\n"):
        if not want.strip() or want.strip() == "…":
            continue
        pattern, kinds = expected_pattern(want.strip())
        found = False
        while at < len(got_lines):
            m = pattern.fullmatch(got_lines[at])
            at += 1
            if m and numbers_match(kinds, m.groups(), numbers_tol, times_factor):
                found = True
                break
        if not found:
            return (f"no output line (after the lines matched before it) matches\n    {want.strip()}\n"
                    f"  (numbers within {numbers_tol:.0%}, times within x{times_factor:g}, … any text)")
    return ""


def run_block(block, cwd, env):
    timeout = float(block.options.get("timeout", "120"))
    t0 = time.monotonic()
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", block.text], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        code = None
    return code, out, time.monotonic() - t0


def scratch_page(root, repo, build, page):
    cwd = os.path.join(root, re.sub(r"[^A-Za-z0-9]+", "-", page))
    os.makedirs(cwd)
    for name in LINKED:
        target = build if name == "build" else os.path.join(repo, name)
        if os.path.exists(target):
            os.symlink(target, os.path.join(cwd, name))
    return cwd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--build", help="the build folder (default: REPO/build)")
    ap.add_argument("--page", action="append", help="run only this page (repeatable)")
    ap.add_argument("--lint-only", action="store_true", help="check the markup and README's shape; run nothing")
    ap.add_argument("--keep", help="scratch folder to keep (default: a temporary one, removed)")
    args = ap.parse_args()
    repo = os.path.abspath(args.repo)
    build = os.path.abspath(args.build or os.path.join(repo, "build"))
    docs = sorted(f for f in os.listdir(os.path.join(repo, "docs")) if f.endswith(".md"))
    pages = ["README.md"] + ["docs/" + f for f in docs]
    parsed, errors = lint(repo, pages)
    for e in errors:
        print("docs: " + e)
    if errors:
        return 1
    counts = sum(1 for p in pages for b in parsed[p] if b.lang == "sh")
    skipped = sum(1 for p in pages for b in parsed[p] if b.lang == "sh" and NOT_RUN.match(b.text))
    if args.lint_only:
        print(f"docs: {len(pages)} pages, {counts} sh blocks ({skipped} marked not run in CI), markup ok")
        return 0

    root = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="weft-docs-")
    if args.keep:
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
    env = dict(os.environ)
    env.update({"XDG_CACHE_HOME": os.path.join(root, "cache"), "WEFT_DEVICE": "cpu",
                "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_rmaps_base_oversubscribe": "1", "NO_COLOR": "1"})
    env.pop("WEFT_PROFILE", None)
    failures, ran, t_all = 0, 0, time.monotonic()
    for page in pages:
        if args.page and page not in args.page:
            continue
        blocks = parsed[page]
        if not any(b.lang == "sh" and not NOT_RUN.match(b.text) for b in blocks):
            continue
        cwd = scratch_page(root, repo, build, page)
        last = None
        for b in blocks:
            if b.lang == "sh":
                if NOT_RUN.match(b.text):
                    print(f"docs: {b.where()} skipped ({b.text.split(chr(10), 1)[0][2:]})")
                    last = None
                    continue
                code, out, wall = run_block(b, cwd, env)
                ran += 1
                if args.keep:
                    with open(os.path.join(cwd, f"block-{b.line}.out"), "w") as f:
                        f.write(out)
                last = (b, out)
                want_code = int(b.options.get("exit", "0"))
                problem = ""
                if code is None:
                    problem = f"still running after its timeout of {b.options.get('timeout', '120')} s"
                elif code != want_code:
                    problem = f"exit code {code}, expected {want_code}"
                elif "time" in b.options:
                    stated, within = float(b.options["time"]), float(b.options.get("within", "2"))
                    if not (stated / within <= wall <= stated * within):
                        problem = (f"took {wall:.1f} s; the page states {stated:g} s "
                                   f"(held within a factor of {within:g})")
                status = "FAILED: " + problem if problem else "ok"
                print(f"docs: {b.where()} {status} ({wall:.1f} s)", flush=True)
                if problem:
                    failures += 1
                    print("  the block:\n" + "\n".join("    " + l for l in b.text.split("\n")))
                    print("  its output (last 40 lines):\n" +
                          "\n".join("    " + l for l in out.rstrip("\n").split("\n")[-40:]))
            elif "output" in b.options and last is not None:
                why = check_output(b, last[1])
                print(f"docs: {b.where()} output of {last[0].where()} " + ("ok" if not why else "FAILED: " + why))
                if why:
                    failures += 1
                    print("  its output (last 60 lines):\n" +
                          "\n".join("    " + l for l in last[1].rstrip("\n").split("\n")[-60:]))
    print(f"docs: {ran} blocks run in {time.monotonic() - t_all:.0f} s, {failures} failed, "
          f"{skipped} marked not run in CI" + (f"; scratch kept in {root}" if args.keep else ""))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
