#!/usr/bin/env bash
# Proves what it can about the container image without a container engine (none runs on the
# development machines or in CI):
#   1. hadolint lints the Dockerfile (installed from PyPI into a venv under target/);
#   2. every source of every COPY exists;
#   3. the build stage's files, exactly as its COPY lines copy them, are placed in a clean
#      directory, and the Dockerfile's own `RUN cargo build …` line runs there.
# A Dockerfile that forgets a file the build needs (a workspace member, build.rs) fails here.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

venv=target/ci-venv
if [ ! -x "$venv/bin/hadolint" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r scripts/requirements-ci.txt
fi
echo "hadolint Dockerfile" >&2
"$venv/bin/hadolint" Dockerfile

# The build stage: the lines between the first FROM and the second.
stage=$(awk '/^FROM /{n++} n==1' Dockerfile)
clean=$(mktemp -d)
trap 'rm -rf "$clean"' EXIT
while read -r _ args; do
  # shellcheck disable=SC2206
  parts=($args)
  dest=${parts[-1]}
  unset 'parts[-1]'
  for src in "${parts[@]}"; do
    [ -e "$src" ] || { echo "error: COPY source '$src' does not exist" >&2; exit 1; }
    if [[ $dest == */ || $dest == ./ ]]; then
      mkdir -p "$clean/$dest" && cp -r "$src" "$clean/$dest"
    else
      mkdir -p "$(dirname "$clean/$dest")" && cp -r "$src" "$clean/$dest"
    fi
  done
done < <(printf '%s\n' "$stage" | grep -E '^COPY ' | grep -v -- '--from')
# The runtime stage's own sources must exist too.
awk '/^FROM /{n++} n==2' Dockerfile | grep -E '^COPY ' | grep -v -- '--from' | while read -r _ src _; do
  [ -e "$src" ] || { echo "error: COPY source '$src' does not exist" >&2; exit 1; }
done

cmd=$(printf '%s\n' "$stage" | sed -n 's/^RUN \(cargo build.*\)$/\1/p')
[ -n "$cmd" ] || { echo "error: no 'RUN cargo build' line in the build stage" >&2; exit 1; }
echo "in a clean directory with only the copied files: $cmd" >&2
# The compiled dependencies are reused from a cache of their own; the sources are only the
# copied ones.
(cd "$clean" && CARGO_TARGET_DIR="$root/target/docker-check" bash -c "$cmd")
bin="$root/target/docker-check/release/agentd"
[ -x "$bin" ] || { echo "error: the build produced no agentd binary" >&2; exit 1; }
"$bin" --version >&2
echo "docker build stage: ok ($(du -h "$bin" | cut -f1) binary)" >&2
