#!/usr/bin/env bash
# Write requirements/dev.lock from pyproject.toml: the dependencies and every extra (dev, gpu,
# kubernetes), each pinned with its hashes, for Python 3.11 and newer on any platform (uv's
# universal resolution: a package needed only somewhere carries a marker). scripts/setup.sh
# installs exactly this (pip install --require-hashes), then the tree with --no-deps.
# Versions already in the lock are kept unless asked otherwise; the package index is needed.
#   scripts/lock.sh                          after editing pyproject.toml: adds and drops what
#                                            changed, keeps every other pin
#   scripts/lock.sh --upgrade                every package to its newest allowed release
#   scripts/lock.sh --upgrade-package NAME   only NAME (repeatable)
#   scripts/lock.sh --check                  exit 1, showing the difference, when the lock is
#                                            not what this would write
# Other arguments go to `uv pip compile`. uv: .venv/bin/uv (the dev extra), else uv on PATH.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
LOCK="requirements/dev.lock"

UV="$ROOT/.venv/bin/uv"
[ -x "$UV" ] || UV="$(command -v uv || true)"
[ -n "$UV" ] || { echo "lock.sh: no uv (run scripts/setup.sh, or pip install uv)" >&2; exit 1; }

compile() { # OUTPUT [uv args...]
  local out="$1"
  shift
  "$UV" pip compile pyproject.toml --all-extras --universal --python-version 3.11 \
    --generate-hashes --custom-compile-command "scripts/lock.sh" --quiet -o "$out" "$@"
}

if [ "${1:-}" = "--check" ]; then
  shift
  tmp="$(mktemp)"
  trap 'rm -f "$tmp"' EXIT
  cp "$LOCK" "$tmp" # the current pins are the preferences, as for a plain run
  compile "$tmp" "$@"
  if ! diff -u "$LOCK" "$tmp"; then
    echo "lock.sh: $LOCK is not what pyproject.toml resolves to; run scripts/lock.sh" >&2
    exit 1
  fi
  echo "lock.sh: $LOCK matches pyproject.toml"
  exit 0
fi
mkdir -p "$(dirname "$LOCK")"
compile "$LOCK" "$@"
echo "lock.sh: wrote $LOCK ($(grep -c '^[a-z0-9]' "$LOCK") packages)"
