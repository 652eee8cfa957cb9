#!/usr/bin/env bash
# pgvector for memory search by meaning (docs/memory.md), for this machine's PostgreSQL 15.
#
#   scripts/pgvector.sh install     build and install pgvector when missing (as root): runs
#                                   ../shared/pgvector/build.sh, the one thing taken from
#                                   outside the repository (Debian 12 packages no pgvector)
#   scripts/pgvector.sh installed   exit 0 when pgvector is installed, else say how to install
#
# One install serves the plain PostgreSQL and every node of the Citus clusters of
# scripts/citus.sh (they run the same PostgreSQL binaries). agentd creates the extension in
# its database by itself (`CREATE EXTENSION vector`, at start).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}

installed() { [ -f "$("$PG_CONFIG" --pkglibdir)/vector.so" ]; }

case "${1:-}" in
  install)
    if installed; then echo "pgvector: already installed" >&2; exit 0; fi
    # Beside the repository (../shared/pgvector); a clone further down finds it in the
    # nearest folder above it that has shared/pgvector, and any other names it with
    # AGENTD_PGVECTOR_SOURCE.
    src=${AGENTD_PGVECTOR_SOURCE:-}
    if [ -z "$src" ]; then
      d=$here
      while [ "$d" != / ] && [ -z "$src" ]; do
        [ -x "$d/shared/pgvector/build.sh" ] && src="$d/shared/pgvector"
        d=$(dirname "$d")
      done
      src=${src:-$here/../shared/pgvector}
    fi
    build="$src/build.sh"
    if [ ! -x "$build" ]; then
      echo "pgvector: not installed, and $build (its source and build script) is missing" >&2
      exit 1
    fi
    if [ "$(id -u)" != 0 ]; then
      echo "pgvector: not installed; run as root: $build" >&2
      exit 1
    fi
    PG_CONFIG="$PG_CONFIG" "$build" >&2
    ;;
  installed)
    if installed; then exit 0; fi
    echo "pgvector is not installed into $("$PG_CONFIG" --pkglibdir): as root, run scripts/pgvector.sh install" >&2
    echo "  (it builds ../shared/pgvector/pgvector-0.8.6.tar.gz with ../shared/pgvector/build.sh)" >&2
    exit 1
    ;;
  *)
    echo "usage: scripts/pgvector.sh install|installed" >&2
    exit 2
    ;;
esac
