#!/usr/bin/env bash
# Remove containers that runner jobs left behind, safely: `runner cleanup` removes only those
# whose attempt has ended (per the job's ledger) and that no runner watches, and lists the
# ones still running (a restarted `runner run` reattaches to those). Arguments are passed on
# (--dry-run, --json).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

[ -x "$ROOT/.venv/bin/runner" ] || die "cleanup: run scripts/setup.sh first"
exec "$ROOT/.venv/bin/runner" cleanup "$@"
