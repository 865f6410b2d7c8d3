#!/usr/bin/env bash
# The project's test command: set up (engine, venv, images), then lint, type-check, check the
# import layers (pyproject's [tool.importlinter]) and test.
#   scripts/test.sh [pytest args...]     e.g. scripts/test.sh -k envelope -x
# Every check runs even when an earlier one fails; the exit status is non-zero if any failed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

bash "$ROOT/scripts/setup.sh"

VENV_BIN="$ROOT/.venv/bin"
failed=()

step() {
  local name="$1"
  shift
  log "test: $name"
  if "$@"; then
    return 0
  else
    local rc=$?
    failed+=("$name (exit $rc)")
    return "$rc"
  fi
}

step "ruff check" "$VENV_BIN/ruff" check . || true
step "ruff format --check" "$VENV_BIN/ruff" format --check . || true
step "mypy" "$VENV_BIN/mypy" || true
step "import layers (lint-imports)" "$VENV_BIN/lint-imports" --no-cache || true
# The documentation site: its generated reference pages up to date with the code, and a strict
# build (a broken link or anchor fails it) into a temporary folder, offline.
step "docs reference (gen_docs --check)" "$VENV_BIN/python" scripts/gen_docs.py --check || true
docs_site="$(mktemp -d)"
step "docs build (mkdocs --strict)" env NO_MKDOCS_2_WARNING=1 "$VENV_BIN/mkdocs" build --strict \
  --quiet --site-dir "$docs_site" || true
rm -rf "$docs_site"

log "test: pytest $*"
rc=0
"$VENV_BIN/python" -m pytest "$@" || rc=$?
case "$rc" in
  0) ;;
  5) failed+=("pytest (exit 5: no tests were collected; a test run that runs nothing is a failure)") ;;
  *) failed+=("pytest (exit $rc)") ;;
esac

if [ "${#failed[@]}" -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
log "test: all checks passed"
