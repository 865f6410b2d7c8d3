#!/usr/bin/env bash
# Set-up for `runner stage` and runner/kubeapply.py's tests, idempotently: the official
# Kubernetes Python client in the venv (the '.[dev]' install of scripts/setup.sh brings it;
# this installs it when a venv predates it). No cluster is set up: none can run here, and
# tests/test_kubeapply.py runs the client against a stand-in API server on 127.0.0.1
# (tests/support/kubeapi.py). `runner stage` needs nothing more than `runner run` does.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

VENV="${RUNNER_VENV:-$ROOT/.venv}"
# The same range as the [kubernetes] extra in pyproject.toml.
WANT="kubernetes>=37,<38"

[ -x "$VENV/bin/python" ] || die "kubeapply: no venv at $VENV (scripts/setup.sh makes it first)"
if "$VENV/bin/python" - "$WANT" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version

from packaging.requirements import Requirement

sys.exit(0 if Requirement(sys.argv[1]).specifier.contains(version("kubernetes")) else 1)
PY
then
  log "kubeapply: the Kubernetes client is installed ($("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("kubernetes"))'))"
else
  log "kubeapply: pip install '$WANT'"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install -q "$WANT" \
    || die "kubeapply: pip install '$WANT' failed"
fi
