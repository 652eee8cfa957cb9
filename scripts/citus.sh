#!/usr/bin/env bash
# A throwaway Citus cluster for agentd's tests and benchmarks: a coordinator and N workers
# (default 2) on free ports, under a directory of your choice.
#
#   scripts/citus.sh install            build and install Citus into PostgreSQL 15 when missing
#                                       (../shared/citus/build.sh: the one thing taken from
#                                       outside this repository; needs root for apt-get)
#   scripts/citus.sh installed          exit 0 when Citus is installed, else say how to install
#   scripts/citus.sh start DIR [N]      start a coordinator + N workers; prints the coordinator's
#                                       URL (database `postgres`, with the extension and the
#                                       workers registered) on stdout
#   scripts/citus.sh stop DIR           stop them and remove DIR
#
# Tests make a database per test themselves (tests/common/citus.rs); `start` only prepares
# the nodes. Runs initdb as the `postgres` user when started as root (initdb refuses root).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-$(command -v pg_config || ls -1 /usr/lib/postgresql/*/bin/pg_config 2>/dev/null | sort -V | tail -n 1)}
bin=$("$PG_CONFIG" --bindir)
# Debian's pg_config --bindir names /usr/bin (wrappers); the server binaries live beside it.
[ -x "$bin/initdb" ] || bin=$(dirname "$PG_CONFIG")

installed() { [ -f "$("$PG_CONFIG" --pkglibdir)/citus.so" ]; }

run_as=()
if [ "$(id -u)" = 0 ]; then run_as=(runuser -u postgres --); fi

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

case "${1:-}" in
  install)
    if installed; then echo "citus: already installed" >&2; exit 0; fi
    # The Citus source and its build script sit beside the repository (../shared/citus); a
    # clone further down finds them in the nearest folder above it that has shared/citus, and
    # any other names them with AGENTD_CITUS_SOURCE.
    src=${AGENTD_CITUS_SOURCE:-}
    if [ -z "$src" ]; then
      d=$here
      while [ "$d" != / ] && [ -z "$src" ]; do
        d=$(dirname "$d")
        [ -x "$d/shared/citus/build.sh" ] && src="$d/shared/citus"
      done
      src=${src:-$here/../shared/citus}
    fi
    build="$src/build.sh"
    if [ ! -x "$build" ]; then
      echo "citus: not installed, and $build (the Citus source and its build script) is missing" >&2
      exit 1
    fi
    if [ "$(id -u)" != 0 ]; then
      echo "citus: not installed; run as root: $build" >&2
      exit 1
    fi
    PG_CONFIG="$PG_CONFIG" "$build" >&2
    ;;
  installed)
    if installed; then exit 0; fi
    echo "Citus is not installed into $("$PG_CONFIG" --pkglibdir): as root, run scripts/citus.sh install" >&2
    echo "  (it builds ../shared/citus/citus-13.2.2.tar.gz with ../shared/citus/build.sh)" >&2
    exit 1
    ;;
  start)
    dir=${2:?usage: citus.sh start DIR [WORKERS]}
    workers=${3:-2}
    installed || { "$0" installed; exit 1; }
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    ports=()
    for i in $(seq 0 "$workers"); do
      port=$(free_port)
      ports+=("$port")
      "${run_as[@]}" "$bin/initdb" -D "$dir/$port" -U postgres --auth=trust >/dev/null
      cat >>"$dir/$port/postgresql.conf" <<CONF
port = $port
shared_preload_libraries = 'citus'
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
max_connections = 300
autovacuum = off
CONF
      "${run_as[@]}" "$bin/pg_ctl" -D "$dir/$port" -l "$dir/$port.log" -w start >/dev/null
      psql -h 127.0.0.1 -p "$port" -U postgres -qc "CREATE EXTENSION citus" >/dev/null
    done
    echo "${ports[*]}" >"$dir/ports"
    c=(psql -h 127.0.0.1 -p "${ports[0]}" -U postgres -qAt)
    "${c[@]}" -c "SELECT citus_set_coordinator_host('127.0.0.1', ${ports[0]})" >/dev/null
    for p in "${ports[@]:1}"; do "${c[@]}" -c "SELECT citus_add_node('127.0.0.1', $p)" >/dev/null; done
    echo "postgres://postgres@127.0.0.1:${ports[0]}/postgres"
    ;;
  stop)
    dir=${2:?usage: citus.sh stop DIR}
    [ -f "$dir/ports" ] || exit 0
    for p in $(cat "$dir/ports"); do
      "${run_as[@]}" "$bin/pg_ctl" -D "$dir/$p" -m immediate stop >/dev/null 2>&1 || true
    done
    rm -rf "$dir"
    ;;
  *)
    sed -n '2,15p' "$0"
    exit 2
    ;;
esac
