#!/usr/bin/env bash
# The README's first command: set up what the toy needs (the engine, the venv and its image),
# then run the toy evaluation through `runner run` and print its result envelope (accuracy
# 0.819). The test command (scripts/test.sh) sets up everything else.
#
#   scripts/demo.sh
#
# Idempotent: on first use it makes a local issuer key (under ~/.config/runner/issuer, or
# $RUNNER_CONFIG_DIR) and trusts it; each run pins the toy contract to the locally built image,
# signs it as a new job (toy-evaluation-<UTC time>) and runs the signed contract under
# $RUNNER_STATE_DIR (default ~/.local/state/runner).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

bash "$ROOT/scripts/setup.sh" --demo  # the engine, the venv and the toy's image; nothing else

RUNNER="$ROOT/.venv/bin/runner"
PY="$ROOT/.venv/bin/python"
TOY="$ROOT/examples/toy-evaluation"
PINNED="$TOY/task.pinned.json"      # git-ignored; beside task.json so its input paths resolve
SIGNED="$TOY/task.pinned.dsse.json" # git-ignored
JOB_ID="toy-evaluation-$(date -u +%Y%m%dT%H%M%SZ)"
CONFIG="${RUNNER_CONFIG_DIR:-$("$PY" -c 'import platformdirs; print(platformdirs.user_config_dir("runner"))')}"
STATE="${RUNNER_STATE_DIR:-$("$PY" -c 'import platformdirs; print(platformdirs.user_state_dir("runner"))')}"
ISSUER="$CONFIG/issuer/local-issuer" # the demo's own issuer key, made on first use

if [ ! -f "$ISSUER.key" ]; then
  log "demo: first use: generating a local issuer key ($ISSUER.key, mode 0600)"
  "$RUNNER" key new --out "$ISSUER" >&2
fi
log "demo: trusting the local issuer on this host"
"$RUNNER" key trust "$ISSUER.pub" >&2

log "demo: pinning runner-cpu:local into the toy contract (issuer side)"
"$RUNNER" contract pin "$TOY/task.json" --image runner-cpu:local -o "$PINNED" >&2

log "demo: signing it for job $JOB_ID (valid for 1 hour)"
"$RUNNER" contract sign "$PINNED" --key "$ISSUER.key" --expires-in 1h --job-id "$JOB_ID" -o "$SIGNED" >&2

log "demo: runner run $SIGNED --state-dir $STATE"
rc=0
"$RUNNER" run "$SIGNED" --state-dir "$STATE" || rc=$?

ENVELOPE="$STATE/jobs/$JOB_ID/result.json"
[ -f "$ENVELOPE" ] || die "demo: no envelope at $ENVELOPE (runner exit $rc)"
log "demo: the result envelope ($ENVELOPE)"
"$ROOT/.venv/bin/python" - "$ENVELOPE" <<'PY'
import json, sys

envelope = json.load(open(sys.argv[1]))
print(json.dumps(envelope, indent=2))
signers = ", ".join(envelope["signature"]["keyIds"]) or "nobody"
for m in envelope["measurements"]:
    print(f"{m['metric']} = {m['value']:g}  ({m['unit']}, {m['parser']['id']}@{m['parser']['version']}"
          f" from {m['evidence']['path']}; status {envelope['status']}; signed by {signers})")
PY
[ "$rc" -eq 0 ] || exit "$rc"

BUNDLE="$(mktemp -d)/$JOB_ID.bag.tar.gz"
log "demo: runner export $JOB_ID -o $BUNDLE, then runner verify-bundle $BUNDLE"
"$RUNNER" job export "$JOB_ID" --state-dir "$STATE" -o "$BUNDLE" >&2
"$RUNNER" verify bundle "$BUNDLE"
