#!/usr/bin/env bash
# The project's test command: set up (engine, venv, images), then lint, type-check, check the
# import layers (pyproject's [tool.importlinter]) and test: tests/unit first (no engine, quick),
# then tests/integration (the engine, Slurm, Podman, a registry, the proxy, and the slow tests).
#   scripts/test.sh [pytest args...]     e.g. scripts/test.sh -k envelope -x
# Options alone go to both runs; arguments naming tests (a path, a node id) make one run of them.
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

# Exit 5 is pytest's "no tests were collected": a test run that runs nothing is a failure. With
# no arguments each part must run tests; with a filter (-k, -m) one part may hold none of them.
names_tests=0
for arg in "$@"; do
  case "$arg" in
    -*) ;;
    *::* | tests | tests/*) names_tests=1 ;;
  esac
done
if [ "$names_tests" -eq 1 ]; then
  parts=("")
else
  parts=(tests/unit tests/integration)
fi
# Each part on several workers (pytest-xdist; each worker its own session id, label, temporary
# and state folders). The unit tests are CPU-bound: one worker a core. The integration tests
# mostly wait on the engine, so they take more workers than cores, a file to a worker
# (`loadfile`: its module fixtures, a registry or a cluster check, are set up once). A later
# `-n`/`--dist` in the arguments wins (`scripts/test.sh -n 0` runs each part in one process).
workers() { # PART
  case "$1" in
    tests/unit) echo "-n auto" ;;
    *) echo "-n ${TEST_INTEGRATION_WORKERS:-4} --dist loadfile" ;;
  esac
}
# The memory cgroups of removed containers live on ("dying") as long as page cache charged to
# them stays cached, and hundreds of them (an earlier test run, a day of jobs) slow every
# container the engine makes and every stats read: here the same batch of 20 toy jobs cost
# dockerd 1.30 CPU seconds with 601 memory cgroups and 0.96 s with 15, and 4.0 s against 3.6 s
# of wall time. Under CI (as root) the clean page cache is dropped before the engine's tests,
# which releases them; never on a developer's machine unasked.
memcgs() { awk '$1 == "memory" { print $3 }' /proc/cgroups 2>/dev/null; }
release_dying_memcgs() {
  [ "${CI:-}" = "true" ] && [ "$(id -u)" -eq 0 ] || return 0
  local before
  before="$(memcgs)"
  sync
  if { echo 1 >/proc/sys/vm/drop_caches; } 2>/dev/null; then
    log "test: page cache dropped before the engine's tests: memory cgroups ${before:-?} -> $(memcgs)"
  else
    log "test: could not drop the page cache (memory cgroups: ${before:-?}); going on"
  fi
}

ran=0
empty=()
for part in "${parts[@]}"; do
  [ "$part" = tests/integration ] && release_dying_memcgs
  log "test: pytest ${part:+$part }$*"
  rc=0
  # shellcheck disable=SC2046 # the options are words
  "$VENV_BIN/python" -m pytest ${part:+"$part"} $(workers "$part") "$@" || rc=$?
  case "$rc" in
    0) ran=1 ;;
    5) empty+=("${part:-(the tests named)}") ;;
    *) ran=1; failed+=("pytest ${part:+$part }(exit $rc)") ;;
  esac
done
if [ "${#empty[@]}" -gt 0 ] && { [ "$#" -eq 0 ] || [ "$ran" -eq 0 ]; }; then
  failed+=("pytest ${empty[*]} (exit 5: no tests were collected; a test run that runs nothing is a failure)")
fi

if [ "${#failed[@]}" -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
log "test: all checks passed"
