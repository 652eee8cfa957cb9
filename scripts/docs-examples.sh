#!/usr/bin/env bash
# Runs the shell examples of README.md and docs/*.md, in order, each file against a fresh
# agentd, so a doc that drifts from the server fails (tests/docs_examples.rs runs this).
#
#   scripts/docs-examples.sh path/to/agentd [FILE.md ...]     # default: README.md docs/*.md
#
# Which blocks run: every block fenced exactly ```sh, top to bottom, all the blocks of one
# file in one bash process (`set -euo pipefail`), so a variable set in one block (B=…, run=…)
# is there in the next. Anything else (```console for commands meant for another terminal or
# machine: starting agentd, docker, installing, psql; ```text, ```python, …) is not run. A
# file without a ```sh block is skipped.
#
# Each file gets its own `agentd serve` on a free loopback port, with an SQLite database in a
# temporary directory, the apps of config/apps, `--webhook-allow-private 127.0.0.1`, a
# `--webhook-secret` and `--schedule-min-interval-secs 1`. Before a file runs, its
# http://127.0.0.1:8000 (the server, as the docs write it) becomes that server's address and
# http://127.0.0.1:8080 (the webhook receiver the docs post to) the address of
# tests/fixtures/webhook_sink.py, which answers every POST with 204. The `assistant` and
# `helpdesk` apps get a scripted model: tests/fixtures/scripted_openai.py, through
# OPENAI_BASE_URL and OPENAI_API_KEY.
#
# `curl` in the examples is a function that runs the real curl and then fails the example
#   - on a connection error or any other curl error (a timeout the command asked for with
#     -m/--max-time is not an error: it is how an example stops following a stream);
#   - on any 5xx;
#   - on a 4xx, unless the command states that status in a `#` comment (the number, anywhere
#     in the comment): on the command's own lines, or on the comment lines right below it
#     (`# 404`, `# 202 while it runs; once it ended, 409 run_not_active`).
# The body stays on stdout, unchanged (-N streams, `-D -` pipes work).
#
# Needs bash, curl, jq (the docs use it) and python3 (the two fixtures; standard library
# only). Prints one line per file; with DOCS_EXAMPLES_VERBOSE=1 also every example's
# output. On a failure it prints the file's output and the server's log, and exits 1.
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 path/to/agentd [FILE.md ...]" >&2
  exit 2
fi
agentd=$(realpath "$1")
shift
root=$(cd "$(dirname "$0")/.." && pwd)
files=()
for f in "$@"; do
  f=$(realpath "$f")
  files+=("${f#"$root"/}")
done
cd "$root"
if [ ${#files[@]} = 0 ]; then files=(README.md docs/*.md); fi
for tool in curl jq python3; do
  if ! command -v "$tool" >/dev/null; then
    echo "docs-examples: the examples need $tool, which is not installed" >&2
    exit 1
  fi
done
# Neither the server nor the examples see the caller's agentd, model or proxy settings.
for v in $(compgen -e); do
  case $v in
    AGENTD_* | OPENAI_* | ANTHROPIC_* | GEMINI_* | GOOGLE_API_KEY | OTEL_* | DATABASE_URL | B) unset "$v" ;;
  esac
done
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# The first line a fixture prints is {"port": N}.
port_of() {
  local out=$1 i
  for i in $(seq 100); do
    if [ -n "$(head -n 1 "$out")" ]; then
      sed -n '1s/.*"port": *\([0-9]*\).*/\1/p' "$out"
      return
    fi
    sleep 0.05
  done
  echo "docs-examples: $out: no port" >&2
  return 1
}

: >"$tmp/model.out"
: >"$tmp/sink.out"
python3 tests/fixtures/scripted_openai.py >>"$tmp/model.out" 2>"$tmp/model.err" &
pids+=($!)
python3 tests/fixtures/webhook_sink.py >>"$tmp/sink.out" 2>"$tmp/sink.err" &
pids+=($!)
model_url="http://127.0.0.1:$(port_of "$tmp/model.out")/v1"
sink_url="http://127.0.0.1:$(port_of "$tmp/sink.out")"
# 32 bytes: the server's secret for webhooks that bring none.
webhook_secret="whsec_$(head -c 32 /dev/urandom | base64 | tr -d '\n')"

# The runnable text of a doc: its ```sh lines where they are, every other line blank (so a
# line number of the script is the doc's), the two URLs replaced; and which 4xx each line's
# command states, as a bash associative array.
extract() {
  python3 - "$@" <<'PY'
import re, sys

doc, script, expect, server, sink = sys.argv[1:6]
lines = open(doc, encoding="utf-8").read().split("\n")
out = [""] * len(lines)
fence = None  # the open fence's label
blocks = []   # [(line number, text)] per ```sh block
for n, line in enumerate(lines, 1):
    m = re.match(r"^\s*```\s*(\S*)\s*$", line)
    if fence is None and m:
        fence = m.group(1)
        if fence == "sh":
            blocks.append([])
        continue
    if fence is not None and re.match(r"^\s*```\s*$", line):
        fence = None
        continue
    if fence == "sh":
        text = line.replace("http://127.0.0.1:8000", server).replace("http://127.0.0.1:8080", sink)
        out[n - 1] = text
        blocks[-1].append((n, line))

def scan(line, quote, depth):
    """The line's comment (or None), and the quote and ( depth at its end."""
    i = 0
    while i < len(line):
        c = line[i]
        if quote == "'":
            if c == "'":
                quote = None
        elif quote == '"':
            if c == "\\":
                i += 1
            elif c == '"':
                quote = None
        elif c == "\\":
            i += 1
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "#" and (i == 0 or line[i - 1] in " \t;|&("):
            return line[i + 1:], quote, depth, line[:i]
        i += 1
    return None, quote, depth, line

expected = {}
for block in blocks:
    quote, depth = None, 0
    group, comments = [], []   # the command being read
    last = None                # the command just ended: (lines, comments)
    for n, line in block:
        stripped = line.strip()
        if quote is None and depth == 0 and not group:
            if not stripped:
                last = None
                continue
            if stripped.startswith("#"):
                if last is not None:  # a comment right below a command is about it
                    last[0].append(n)
                    last[1].append(stripped[1:])
                continue
        comment, quote, depth, code = scan(line, quote, depth)
        group.append(n)
        if comment is not None:
            comments.append(comment)
        code = code.rstrip()
        continued = (quote is not None or depth > 0 or code.endswith("\\")
                     or code.endswith("|") or code.endswith("&&") or code.endswith("||"))
        if not continued:
            last = (group, comments)
            for ln in group:
                expected[ln] = (group, comments)
            group, comments = [], []

with open(script, "w", encoding="utf-8") as f:
    f.write("\n".join(out) + "\n")
with open(expect, "w", encoding="utf-8") as f:
    f.write("declare -gA DOC_EXPECT=(\n")
    for ln, (group, comments) in sorted(expected.items()):
        codes = sorted(set(re.findall(r"\b([45]\d\d)\b", " ".join(comments))))
        if codes:
            f.write(f"  [{ln}]=\"{' '.join(codes)}\"\n")
    f.write(")\n")
print(len(blocks))
PY
}

# What runs the doc: the curl function, then the doc's script, sourced so that LINENO and
# BASH_LINENO are the doc's line numbers.
cat >"$tmp/prelude.sh" <<'SH'
set -Eeuo pipefail
source "$DOC_EXPECT_FILE"
trap 'echo "docs-examples: $DOC_FILE:$LINENO: this command failed (exit $?)" >&2' ERR
curl() {
  set -- --no-progress-meter "$@"
  local line=${BASH_LINENO[0]} err rc=0 code arg timeout_asked=
  err=$(mktemp "$DOC_TMP/curl.XXXXXX")
  command curl "$@" --write-out '%{stderr}\n@@docs-status=%{http_code}\n' 2>"$err" || rc=$?
  code=$(sed -n 's/^@@docs-status=//p' "$err" | tail -n 1)
  grep -v '^@@docs-status=' "$err" | sed '/^$/d' >&2 || true
  rm -f "$err"
  for arg in "$@"; do
    case $arg in -m | --max-time | --max-time=*) timeout_asked=1 ;; esac
  done
  if [ "$rc" = 28 ] && [ -n "$timeout_asked" ]; then
    rc=0
  fi
  if [ "$rc" != 0 ]; then
    echo "docs-examples: $DOC_FILE:$line: curl failed (exit $rc, HTTP ${code:-none})" >&2
    return 1
  fi
  case $code in
    4??)
      if [[ " ${DOC_EXPECT[$line]:-} " != *" $code "* ]]; then
        echo "docs-examples: $DOC_FILE:$line: HTTP $code, and no '# $code' comment states it" >&2
        return 1
      fi ;;
    5??)
      echo "docs-examples: $DOC_FILE:$line: HTTP $code" >&2
      return 1 ;;
  esac
}
source "$DOC_SCRIPT"
SH

failed=0
start_all=$EPOCHREALTIME
for file in "${files[@]}"; do
  name=$(basename "$file" .md)
  work="$tmp/$name"
  mkdir -p "$work"
  grep -q '^[[:space:]]*```sh[[:space:]]*$' "$file" || continue

  start=$EPOCHREALTIME
  : >"$work/agentd.log"
  OPENAI_BASE_URL="$model_url" OPENAI_API_KEY=scripted RUST_LOG=agentd=info \
    "$agentd" serve --bind 127.0.0.1:0 --database-url "sqlite://$work/agentd.db" \
    --apps-dir config/apps --log-format json \
    --webhook-allow-private 127.0.0.1 --webhook-secret "$webhook_secret" \
    --schedule-min-interval-secs 1 --drain-secs 0 --shutdown-grace-secs 1 \
    >>"$work/agentd.log" 2>&1 &
  server=$!
  pids+=("$server")
  addr=
  for _ in $(seq 400); do
    addr=$(sed -n 's/.*"message":"agentd listening","addr":"\([^"]*\)".*/\1/p' "$work/agentd.log")
    [ -n "$addr" ] && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.05
  done
  if [ -z "$addr" ]; then
    echo "FAIL $file: agentd did not start" >&2
    cat "$work/agentd.log" >&2
    exit 1
  fi
  blocks=$(extract "$file" "$work/script.sh" "$work/expect.sh" "http://$addr" "$sink_url")

  status=0
  (
    cd "$work"
    DOC_FILE="$file" DOC_TMP="$work" DOC_SCRIPT="$work/script.sh" \
      DOC_EXPECT_FILE="$work/expect.sh" timeout 60 bash "$tmp/prelude.sh"
  ) >"$work/out.log" 2>&1 </dev/null || status=$?
  kill -INT "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  secs=$(awk "BEGIN { printf \"%.1f\", $EPOCHREALTIME - $start }")
  if [ "${DOCS_EXAMPLES_VERBOSE:-}" = 1 ]; then
    awk -v f="$file" '{ print "  " f ": " $0 }' "$work/out.log"
  fi
  if [ "$status" = 0 ]; then
    printf 'ok   %-22s %2d blocks  %ss\n' "$file" "$blocks" "$secs"
  else
    failed=1
    printf 'FAIL %-22s (exit %s)\n' "$file" "$status"
    echo "---- output of $file's examples (line numbers are the doc's) ----"
    awk '{ print }' "$work/out.log"
    echo "---- agentd log (last 40 lines) ----"
    tail -n 40 "$work/agentd.log"
    echo "----"
  fi
done
if [ "${DOCS_EXAMPLES_VERBOSE:-}" = 1 ]; then
  echo "webhook deliveries received (tests/fixtures/webhook_sink.py):"
  tail -n +2 "$tmp/sink.out" | sed 's/^/  /'
fi
total=$(awk "BEGIN { printf \"%.1f\", $EPOCHREALTIME - $start_all }")
echo "docs examples: $([ $failed = 0 ] && echo passed || echo FAILED) in ${total}s"
exit $failed
