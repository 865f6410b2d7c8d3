#!/usr/bin/env bash
# Single-node Slurm for the tests of `runner submit --to slurm`: installs Debian's munge,
# slurmctld, slurmd and slurm-client when missing, writes /etc/slurm/slurm.conf, and starts
# munged, slurmctld and slurmd as root without systemd. A cluster that already answers
# `sinfo` with this script's configuration is reused. Idempotent. A Slurm that does not
# come up fails the set-up and prints its logs. Then scripts/setup_slurm_nodes.sh starts the
# second, two-node cluster (its own slurmctld here, its nodes in containers) for the tests of
# a job moving between hosts; `scripts/setup_slurm_nodes.sh --down` removes it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/lib.sh
source "$here/lib.sh"

SLURM_ETC=/etc/slurm
SLURM_CONF="$SLURM_ETC/slurm.conf"
SLURM_STATE=/var/spool/slurmctld
SLURMD_SPOOL=/var/spool/slurmd
SLURM_LOGS=/var/log/slurm
SLURM_JOBCOMP="$SLURM_LOGS/jobcomp.log"
# The Epilog that stops a container whose runner was killed (scripts/slurm-epilog.sh), with
# this checkout's runner.
SLURM_EPILOG="$SLURM_ETC/runner-epilog.sh"
RUNNER_CMD="$(cd "$here/.." && pwd)/.venv/bin/python -m runner"
# The runner's --stop-grace defaults to 5 s; KillWait (SIGTERM to SIGKILL) must leave the
# runner time to stop its container and record the attempt: grace + 25 s of margin.
SLURM_KILLWAIT=30

ensure_packages() {
  local missing=()
  command -v munged >/dev/null 2>&1 || missing+=(munge)
  command -v slurmctld >/dev/null 2>&1 || missing+=(slurmctld)
  command -v slurmd >/dev/null 2>&1 || missing+=(slurmd)
  command -v sbatch >/dev/null 2>&1 || missing+=(slurm-client)
  if [ "${#missing[@]}" -gt 0 ]; then
    log "slurm: installing ${missing[*]}"
    apt_install "${missing[@]}"
  else
    log "slurm: reusing the installed munge and slurm packages"
  fi
}

ensure_munge() {
  as_root mkdir -p /etc/munge /var/run/munge /var/log/munge /var/lib/munge
  if [ ! -s /etc/munge/munge.key ]; then
    log "slurm: creating a munge key"
    as_root dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  as_root chown root:root /etc/munge/munge.key /etc/munge /var/run/munge /var/log/munge /var/lib/munge
  as_root chmod 0400 /etc/munge/munge.key
  as_root chmod 0700 /etc/munge /var/log/munge /var/lib/munge
  as_root chmod 0755 /var/run/munge
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "slurm: reusing the running munged"
    return 0
  fi
  log "slurm: starting munged"
  as_root munged --force
  local waited=0
  until munge -n 2>/dev/null | unmunge >/dev/null 2>&1; do
    [ "$waited" -lt 10 ] || die "slurm: munged did not start (see /var/log/munge/munged.log)"
    sleep 1
    waited=$((waited + 1))
  done
}

# write_conf: the configuration this script wants; returns 0 when it changed the file.
write_conf() {
  local cpus mem_mb want
  cpus="$(nproc)"
  # RealMemory a bit under the machine's memory (slurmd refuses a node that reports less).
  mem_mb="$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)"
  want="$(cat <<EOF
# Written by scripts/setup_slurm.sh: a single-node cluster for the runner's tests.
ClusterName=runner
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
StateSaveLocation=$SLURM_STATE
SlurmdSpoolDir=$SLURMD_SPOOL
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$SLURM_LOGS/slurmctld.log
SlurmdLogFile=$SLURM_LOGS/slurmd.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
EnforcePartLimits=ALL
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
# Finished jobs stay visible to scontrol for 5 minutes; after that, the jobcomp file.
MinJobAge=300
JobCompType=jobcomp/filetxt
JobCompLoc=$SLURM_JOBCOMP
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=$SLURM_KILLWAIT
Epilog=$SLURM_EPILOG
InactiveLimit=0
MaxJobCount=10000
NodeName=localhost CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
)"
  as_root mkdir -p "$SLURM_ETC" "$SLURM_STATE" "$SLURMD_SPOOL" "$SLURM_LOGS"
  install_epilog "$SLURM_EPILOG" "$RUNNER_CMD"
  if [ -f "$SLURM_CONF" ] && [ "$(cat "$SLURM_CONF")" = "$want" ]; then
    return 1
  fi
  log "slurm: writing $SLURM_CONF ($cpus CPUs, RealMemory=${mem_mb} MB)"
  printf '%s\n' "$want" | as_root tee "$SLURM_CONF" >/dev/null
  return 0
}

slurm_up() {
  sinfo -h -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated|completing)'
}

stop_daemons() {
  local name pid
  for name in slurmd slurmctld; do
    pid="$(cat "/run/$name.pid" 2>/dev/null || true)"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      log "slurm: stopping $name ($pid) to load the new configuration"
      as_root kill "$pid"
      for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    fi
  done
}

show_logs_and_die() {
  printf '%s\n' '--- slurmctld.log (tail)' >&2
  tail -n 40 "$SLURM_LOGS/slurmctld.log" >&2 2>/dev/null || true
  printf '%s\n' '--- slurmd.log (tail)' >&2
  tail -n 40 "$SLURM_LOGS/slurmd.log" >&2 2>/dev/null || true
  die "slurm: $1"
}

start_daemons() {
  local pid
  pid="$(cat /run/slurmctld.pid 2>/dev/null || true)"
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    log "slurm: starting slurmctld"
    as_root slurmctld -f "$SLURM_CONF" || show_logs_and_die "slurmctld did not start"
  fi
  pid="$(cat /run/slurmd.pid 2>/dev/null || true)"
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    log "slurm: starting slurmd"
    as_root slurmd -f "$SLURM_CONF" -N localhost || show_logs_and_die "slurmd did not start"
  fi
  local waited=0
  until slurm_up; do
    [ "$waited" -lt 30 ] || show_logs_and_die "the node localhost is not idle after 30 s ($(sinfo -h -o '%T' 2>&1 || true))"
    sleep 1
    waited=$((waited + 1))
  done
  # A node left DOWN/DRAIN by an earlier run comes back.
  if sinfo -h -o '%T' | grep -Eq 'down|drain'; then
    as_root scontrol update nodename=localhost state=resume || true
  fi
}

start=$SECONDS
ensure_packages
ensure_munge
if write_conf; then
  stop_daemons
fi
if slurm_up && [ -f /run/slurmd.pid ] && kill -0 "$(cat /run/slurmd.pid)" 2>/dev/null; then
  log "slurm: reusing the running cluster"
else
  start_daemons
fi
log "slurm: ready in $((SECONDS - start))s: $(sinfo -h -o '%P %D %c CPUs %m MB %T')"
"$here/setup_slurm_nodes.sh"
