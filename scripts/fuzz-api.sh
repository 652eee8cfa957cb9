#!/usr/bin/env bash
# Property-based testing of a running agentd against its own OpenAPI document: schemathesis
# generates requests for every operation (schema examples, boundary and invalid values, then
# random ones) and fails on any 5xx, any undocumented status, content type or header, and any
# body (SSE events included) that contradicts the document.
#
#   scripts/fuzz-api.sh BASE_URL [schemathesis run options...]
#   e.g. scripts/fuzz-api.sh http://127.0.0.1:8000 --max-examples 100
#
# tests/openapi.rs runs it against both backends. Settings: tests/clients/schemathesis/
# schemathesis.toml; FUZZ_SEED (default 1) and FUZZ_MAX_EXAMPLES (per operation, default 30).
# schemathesis itself is installed by scripts/test.sh (hash-pinned, into
# target/test-clients/schemathesis). Point it at a throwaway server: it writes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
st="${SCHEMATHESIS:-$root/target/test-clients/schemathesis/bin/st}"
if [ ! -x "$st" ]; then
  echo "error: schemathesis is not installed at $st: run ./scripts/test.sh, or" >&2
  echo "  python3 -m venv target/test-clients/schemathesis && target/test-clients/schemathesis/bin/pip install --require-hashes -r tests/clients/schemathesis/requirements.txt" >&2
  exit 1
fi
base="${1:?usage: scripts/fuzz-api.sh BASE_URL [schemathesis run options...]}"
shift
# schemathesis keeps caches in the working directory; keep them out of the repository. One
# worker: with two, hypothesis 6 on Python 3.11 sometimes fails inside itself ("AST
# constructor recursion depth mismatch"), which is not a finding about agentd.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$st" --config-file "$root/tests/clients/schemathesis/schemathesis.toml" run "${base%/}/openapi.json" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance \
  --phases examples,coverage,fuzzing \
  --max-examples "${FUZZ_MAX_EXAMPLES:-30}" \
  --seed "${FUZZ_SEED:-1}" \
  --request-timeout 20 \
  --workers 1 \
  --no-color \
  "$@"
