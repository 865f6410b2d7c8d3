#!/bin/sh
# Slurm Epilog for the nodes that run `runner submit --to slurm` jobs (README: "Running on a
# cluster"). Slurm runs it as root on the node when a job ends, and starts the job again
# (a requeue) only once it is done. A container whose runner was killed (SIGKILL after
# KillWait, the OOM killer) runs on with no one watching; this stops it and records its
# attempt in the job's ledger (`runner cleanup --orphans`), so that the job's next runner, on
# this node or another, never runs beside it. It exits non-zero when it could not, and Slurm
# then drains the node: a container that may still run is no node to schedule on. A container
# whose job a live runner on this node still owns (a `runner serve` runner, whose batch step
# was ended from outside) is that runner's to watch: it is left running and is no failure.
#
# Install: copy it to the nodes, set RUNNER to the runner command there, and name it in
# slurm.conf: Epilog=/etc/slurm/runner-epilog.sh. scripts/setup_slurm.sh does this for the
# single-node test cluster.
RUNNER="${RUNNER:-runner}"
LOG="${RUNNER_EPILOG_LOG:-/var/log/slurm/runner-epilog.log}"
label="slurm.job-id=${SLURM_JOB_ID:?Slurm sets SLURM_JOB_ID for an Epilog}"

# The cheap question first (every job's end pays it): does any engine here hold a container
# of this job? `runner submit`'s batch script puts this label on it. Each engine that does is
# cleaned by a runner aimed at it (RUNNER_ENGINE), then asked again.
status=0
for engine in docker podman; do
  command -v "$engine" >/dev/null 2>&1 || continue
  [ -n "$("$engine" ps -q --filter "label=$label" 2>/dev/null || true)" ] || continue
  echo "$(date -u +%FT%TZ) job $SLURM_JOB_ID: stopping what its runner left ($engine)" >>"$LOG"
  # shellcheck disable=SC2086  # RUNNER may be "python -m runner"
  # It exits 4 when a container it was to stop still runs; one a live runner owns is kept.
  if ! RUNNER_ENGINE="$engine" $RUNNER cleanup --orphans --label "$label" --json >>"$LOG" 2>&1; then
    echo "$(date -u +%FT%TZ) job $SLURM_JOB_ID: a container may still run ($engine)" >>"$LOG"
    status=1
  elif [ -n "$("$engine" ps -q --filter "label=$label" 2>/dev/null || true)" ]; then
    echo "$(date -u +%FT%TZ) job $SLURM_JOB_ID: a live runner here still owns it ($engine)" >>"$LOG"
  fi
done
exit "$status"
