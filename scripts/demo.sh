#!/usr/bin/env bash
# The README's first command: set everything up if needed, then run the toy evaluation
# through `runner run` and print its result envelope (accuracy 0.819).
#
#   scripts/demo.sh
#
# Idempotent: each run pins the toy contract to the locally built image again and runs it as a
# new job (toy-evaluation-<UTC time>) under $RUNNER_STATE_DIR (default ~/.local/state/runner).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

bash "$ROOT/scripts/setup.sh"

RUNNER="$ROOT/.venv/bin/runner"
TOY="$ROOT/examples/toy-evaluation"
PINNED="$TOY/task.pinned.json" # git-ignored; beside task.json so its input paths resolve
JOB_ID="toy-evaluation-$(date -u +%Y%m%dT%H%M%SZ)"

log "demo: pinning runner-cpu:local into the toy contract (issuer side)"
"$RUNNER" pin "$TOY/task.json" --image runner-cpu:local -o "$PINNED" >&2

STATE="${RUNNER_STATE_DIR:-$("$ROOT/.venv/bin/python" -c 'import platformdirs; print(platformdirs.user_state_dir("runner"))')}"

log "demo: runner run $PINNED --job-id $JOB_ID --state-dir $STATE"
rc=0
"$RUNNER" run "$PINNED" --job-id "$JOB_ID" --state-dir "$STATE" || rc=$?

ENVELOPE="$STATE/jobs/$JOB_ID/result.json"
[ -f "$ENVELOPE" ] || die "demo: no envelope at $ENVELOPE (runner exit $rc)"
log "demo: the result envelope ($ENVELOPE)"
"$ROOT/.venv/bin/python" - "$ENVELOPE" <<'PY'
import json, sys

envelope = json.load(open(sys.argv[1]))
print(json.dumps(envelope, indent=2))
for m in envelope["measurements"]:
    print(f"{m['metric']} = {m['value']:g}  ({m['unit']}, {m['parser']['id']}@{m['parser']['version']}"
          f" from {m['evidence']['path']}; status {envelope['status']})")
PY
exit "$rc"
