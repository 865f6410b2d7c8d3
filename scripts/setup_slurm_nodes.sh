#!/usr/bin/env bash
# The test cluster of two nodes: Slurm's compute nodes rnode1 and rnode2, each a container on
# this host's engine with its own hostname and address, under a second slurmctld on this host
# (cluster runner-nodes, port 6820, /etc/slurm-nodes/slurm.conf, one partition `two`), for the
# tests of a job moving between hosts (tests/integration/test_slurm_two_nodes.py). Slurm's
# commands reach it with SLURM_CONF=/etc/slurm-nodes/slurm.conf. The single-node cluster of
# scripts/setup_slurm.sh, which runs this, is left as it is. Idempotent: a running controller
# and nodes of the current configuration, image and mounts are reused.
#   scripts/setup_slurm_nodes.sh          set up (or reuse) the cluster
#   scripts/setup_slurm_nodes.sh --down   remove the nodes, their network, their controller and
#                                         the shared folder's mount (its files stay)
#
# Each node runs munged (the host's key, bind-mounted read-only) and slurmd with the host's
# /etc/slurm-nodes (read-only: the controller's slurm.conf and Epilog). What a job on a node
# needs is at the same path as on this host, so that `runner run` there starts its job
# container on this host's engine (its socket is bind-mounted) with paths the engine can
# mount: this checkout and its venv (and the Python the venv was made from), read-only, and
# the shared folder. The nodes reach the controller by this host's name, which each node's
# /etc/hosts maps to the gateway of their network runner-slurm.
#
# The shared folder is an sshfs mount (FUSE, type fuse.sshfs) of a folder beside it: sshfs
# speaks SFTP to OpenSSH's sftp-server, started as sshfs's "ssh" command (no sshd, no key, no
# network port). `runner cluster submit` rightly refuses a local filesystem as the state folder
# of a partition of several nodes; this is a network filesystem's client that every node
# mounts as the same folder, as on a cluster.
#
# The node image runner-slurm-node:local is built with no network: Debian's slurmd,
# slurm-client and munge with the packages the base image lacks (apt's own resolution against
# the base's dpkg status) are fetched on the host into the git-ignored images/slurm-node/debs/.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$here/.." && pwd)"
# shellcheck source=scripts/lib.sh
source "$here/lib.sh"

NODES=(rnode1 rnode2)
NETWORK=runner-slurm
PREFIX="${RUNNER_NODES_SUBNET_PREFIX:-10.213.0}" # the network's /24
ETC=/etc/slurm-nodes
CONF="$ETC/slurm.conf"
PORT=6820
CTLD_STATE=/var/spool/slurmctld-nodes
CTLD_PID=/run/slurmctld-nodes.pid
LOGS=/var/log/slurm/nodes
RUNNER_CMD="$ROOT/.venv/bin/python -m runner"
IMAGE=runner-slurm-node:local
BASE="${RUNNER_BASE_IMAGE:-runner-base:bookworm}"
DEBS="$ROOT/images/slurm-node/debs"
SHARED="${RUNNER_NODES_SHARED:-/var/lib/runner-nodes/shared}"
SHARED_BACK="$(dirname "$SHARED")/export"
SFTP_SHIM="$(dirname "$SHARED")/local-sftp"
VENV="$ROOT/.venv"
CTLD_HOST="$(hostname -s)"
SSHFS_CACHE="dir_cache=no,attr_timeout=0,entry_timeout=0,negative_timeout=0"

# The shared folder is mounted (the topmost mount there is sshfs).
shared_mounted() { [ "$(findmnt -n -o FSTYPE --mountpoint "$SHARED" 2>/dev/null | tail -n 1)" = fuse.sshfs ]; }

node_running() { [ "$(docker inspect -f '{{.State.Running}}' "$1" 2>/dev/null)" = true ]; }

down() {
  local node
  for node in "${NODES[@]}"; do
    docker rm -f "$node" >/dev/null 2>&1 && log "nodes: removed $node" || true
  done
  docker network rm "$NETWORK" >/dev/null 2>&1 && log "nodes: removed network $NETWORK" || true
  local pid
  pid="$(cat "$CTLD_PID" 2>/dev/null || true)"
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    as_root kill "$pid" && log "nodes: stopped their slurmctld ($pid)"
  fi
  if shared_mounted; then
    fusermount3 -uz "$SHARED" && log "nodes: unmounted $SHARED (its files stay in $SHARED_BACK)"
  fi
}

# write_conf: the cluster's slurm.conf and Epilog; returns 0 when the configuration changed.
write_conf() {
  local want
  getent hosts "$CTLD_HOST" >/dev/null \
    || die "nodes: this host's name $CTLD_HOST (SlurmctldHost) does not resolve here; add it to /etc/hosts"
  want="$(cat <<EOF
# Written by scripts/setup_slurm_nodes.sh: the two-node cluster of the runner's tests.
ClusterName=runner-nodes
# Its job ids never meet the single-node cluster's (numbered from 1): both clusters' jobs
# run on this host's one engine, and an Epilog's cleanup --orphans --label slurm.job-id=N
# would stop the other cluster's job N too.
FirstJobId=500000
SlurmctldHost=$CTLD_HOST
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
StateSaveLocation=$CTLD_STATE
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
EnforcePartLimits=ALL
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
MinJobAge=300
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGS/jobcomp.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=30
Epilog=$ETC/runner-epilog.sh
InactiveLimit=0
# A node that stops answering is DOWN after 30 s (not 300), and its jobs are requeued.
SlurmdTimeout=30
NodeName=rnode1 NodeAddr=$PREFIX.11 CPUs=$(nproc) RealMemory=4096 State=UNKNOWN
NodeName=rnode2 NodeAddr=$PREFIX.12 CPUs=$(nproc) RealMemory=4096 State=UNKNOWN
PartitionName=two Nodes=rnode1,rnode2 Default=YES MaxTime=INFINITE State=UP
EOF
)"
  as_root mkdir -p "$ETC" "$CTLD_STATE" "$LOGS"
  install_epilog "$ETC/runner-epilog.sh" "$RUNNER_CMD"
  if [ -f "$CONF" ] && [ "$(cat "$CONF")" = "$want" ]; then
    return 1
  fi
  log "nodes: writing $CONF"
  printf '%s\n' "$want" | as_root tee "$CONF" >/dev/null
  return 0
}

ensure_controller() {
  local pid changed=1
  write_conf && changed=0
  pid="$(cat "$CTLD_PID" 2>/dev/null || true)"
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    if [ "$changed" -ne 0 ]; then
      log "nodes: reusing their slurmctld ($pid)"
      return 0
    fi
    log "nodes: stopping their slurmctld ($pid) to load the new configuration"
    as_root kill "$pid"
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  fi
  log "nodes: starting their slurmctld (port $PORT)"
  as_root slurmctld -f "$CONF" || { tail -n 30 "$LOGS/slurmctld.log" >&2; die "nodes: slurmctld did not start"; }
  local waited=0
  until SLURM_CONF="$CONF" sinfo -h >/dev/null 2>&1; do
    [ "$waited" -lt 20 ] || { tail -n 30 "$LOGS/slurmctld.log" >&2; die "nodes: slurmctld does not answer"; }
    sleep 1
    waited=$((waited + 1))
  done
}

ensure_host_packages() {
  local missing=()
  command -v sshfs >/dev/null 2>&1 || missing+=(sshfs)
  [ -x /usr/lib/openssh/sftp-server ] || missing+=(openssh-sftp-server)
  if [ "${#missing[@]}" -gt 0 ]; then
    apt_install "${missing[@]}"
  fi
}

ensure_shared() {
  if shared_mounted && [ -d "$SHARED/." ] \
    && [ "$(cat "$(dirname "$SHARED")/.mount-options" 2>/dev/null)" = "$SSHFS_CACHE" ]; then
    log "nodes: reusing the shared folder $SHARED (sshfs of $SHARED_BACK)"
    return 0
  fi
  # A mount whose sftp-server died answers nothing ("Transport endpoint is not connected").
  fusermount3 -uz "$SHARED" >/dev/null 2>&1 || true
  as_root mkdir -p "$SHARED" "$SHARED_BACK"
  as_root chmod 0755 "$SHARED_BACK"
  printf '%s\n' '#!/bin/sh' \
    '# sshfs runs this as its "ssh" command: OpenSSH'"'"'s sftp-server on stdin/stdout, here.' \
    'exec /usr/lib/openssh/sftp-server' | as_root tee "$SFTP_SHIM" >/dev/null
  as_root chmod 0755 "$SFTP_SHIM"
  log "nodes: mounting $SHARED (sshfs of $SHARED_BACK)"
  # allow_other: the engine (root) and job containers (other uids) use it. No caching (the
  # nodes and the engine's containers write and read the same files within a second, as on a
  # network filesystem with close-to-open consistency). No default_permissions: sftp-server
  # runs as root and creates every file as root, so the kernel would refuse a job's uid the
  # files it made; the modes are not checked on this folder (test storage only).
  as_root sshfs -o "ssh_command=$SFTP_SHIM,allow_other,$SSHFS_CACHE" \
    "localhost:$SHARED_BACK" "$SHARED" || die "nodes: sshfs mount of $SHARED failed"
  printf '%s\n' "$SSHFS_CACHE" | as_root tee "$(dirname "$SHARED")/.mount-options" >/dev/null
}

ensure_debs() {
  if compgen -G "$DEBS/slurmd_*.deb" >/dev/null && compgen -G "$DEBS/munge_*.deb" >/dev/null \
    && compgen -G "$DEBS/slurm-client_*.deb" >/dev/null; then
    log "nodes: reusing $(find "$DEBS" -name '*.deb' | wc -l) .debs in images/slurm-node/debs"
    return 0
  fi
  local status pkgs
  status="$(mktemp)"
  docker run --rm --network none --entrypoint cat "$BASE" /var/lib/dpkg/status >"$status"
  # What apt would install into the base (its own dpkg status), without recommends.
  pkgs="$(apt-get install -s --no-install-recommends -o "Dir::State::status=$status" \
    slurmd slurm-client munge 2>/dev/null | awk '/^Inst /{print $2}')"
  if [ -z "$pkgs" ]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    pkgs="$(apt-get install -s --no-install-recommends -o "Dir::State::status=$status" \
      slurmd slurm-client munge 2>/dev/null | awk '/^Inst /{print $2}')"
  fi
  rm -f "$status"
  [ -n "$pkgs" ] || die "nodes: apt cannot resolve slurmd, slurm-client and munge for $BASE"
  mkdir -p "$DEBS"
  log "nodes: apt-get download $(echo "$pkgs" | wc -l) packages into images/slurm-node/debs"
  # shellcheck disable=SC2086 # a word list
  (cd "$DEBS" && apt-get download $pkgs >/dev/null 2>&1) \
    || die "nodes: apt-get download $(echo $pkgs) failed"
}

ensure_image() {
  docker image inspect "$BASE" >/dev/null 2>&1 \
    || die "nodes: the base image $BASE is missing: run scripts/setup.sh (it builds it)"
  ensure_debs
  local want have build_log
  want="$( (docker image inspect --format '{{.Id}}' "$BASE"; cat "$ROOT/images/slurm-node/Dockerfile" \
    "$ROOT/images/slurm-node/node-entrypoint"; ls "$DEBS") | sha256sum | cut -d' ' -f1)"
  have="$(docker image inspect --format '{{index .Config.Labels "org.runner.inputs"}}' "$IMAGE" 2>/dev/null || true)"
  if [ "$want" = "$have" ]; then
    log "nodes: reusing $IMAGE"
    return 0
  fi
  log "nodes: building $IMAGE from images/slurm-node (base $BASE, --network none)"
  build_log="$(mktemp)"
  if ! docker build --network none --build-arg "BASE=$BASE" --label "org.runner.inputs=$want" \
    -t "$IMAGE" "$ROOT/images/slurm-node" >"$build_log" 2>&1; then
    cat "$build_log" >&2
    rm -f "$build_log"
    die "nodes: docker build of $IMAGE failed (log above)"
  fi
  rm -f "$build_log"
}

ensure_network() {
  if docker network inspect "$NETWORK" >/dev/null 2>&1; then
    return 0
  fi
  log "nodes: creating the network $NETWORK ($PREFIX.0/24, this host at $PREFIX.1)"
  docker network create --driver bridge --subnet "$PREFIX.0/24" --gateway "$PREFIX.1" \
    "$NETWORK" >/dev/null || die "nodes: could not create $NETWORK (set RUNNER_NODES_SUBNET_PREFIX to a free /24, e.g. 10.214.0)"
}

# The folders a job's `runner run` needs on the node, each at its own path: this checkout, the
# venv's real folder, the folder the runner package is imported from (an editable install may
# point elsewhere), and the Python the venv was made from (unless it is the system's, which
# the node image has too).
mounts() {
  local path
  {
    echo "$ROOT"
    # From / and without PYTHONPATH: where the venv itself imports the runner from.
    (cd / && env -u PYTHONPATH "$VENV/bin/python" -) <<'PY'
import os, sys, runner
print(os.path.realpath(sys.prefix))
print(os.path.dirname(os.path.dirname(os.path.realpath(runner.__file__))))
if not os.path.realpath(sys.base_prefix).startswith("/usr"):
    print(os.path.realpath(sys.base_prefix))
PY
  } | sort -u | while read -r path; do
    printf -- '--volume=%s:%s:ro\n' "$path" "$path"
  done
}

start_node() { # NODE INDEX
  local node="$1" ip="$PREFIX.$((10 + $2))" docker_cli args=()
  docker_cli="$(command -v docker)"
  mapfile -t args < <(mounts)
  as_root mkdir -p "$LOGS/$node"
  docker rm -f "$node" >/dev/null 2>&1 || true
  log "nodes: starting $node at $ip"
  docker run -d --name "$node" --hostname "$node" --network "$NETWORK" --ip "$ip" \
    --add-host "$CTLD_HOST:$PREFIX.1" --restart no \
    --label org.runner.slurm-node="$node" --label "org.runner.inputs=$3" \
    --volume "$ETC:$ETC:ro" \
    --volume /etc/munge/munge.key:/etc/munge/munge.key:ro \
    --volume /var/run/docker.sock:/var/run/docker.sock \
    --volume "$docker_cli:/usr/bin/docker:ro" \
    --volume "$LOGS/$node:/var/log/slurm" \
    --volume "$SHARED:$SHARED" \
    "${args[@]}" \
    "$IMAGE" "$node" "$CONF" >/dev/null || die "nodes: docker run of $node failed"
}

ensure_nodes() {
  local i node want
  want="$( (docker image inspect --format '{{.Id}}' "$IMAGE"; mounts; echo "$SHARED $CTLD_HOST $(stat -c %d "$SHARED")"; sha256sum "$CONF") | sha256sum | cut -d' ' -f1)"
  for i in "${!NODES[@]}"; do
    node="${NODES[$i]}"
    if node_running "$node" \
      && [ "$(docker inspect -f '{{index .Config.Labels "org.runner.inputs"}}' "$node")" = "$want" ]; then
      log "nodes: reusing $node"
    else
      start_node "$node" "$((i + 1))" "$want"
    fi
  done
  local waited=0 state
  until state="$(SLURM_CONF="$CONF" sinfo -h -N -o '%N %T' 2>/dev/null)" \
    && [ "$(grep -cE ' (idle|mixed|allocated|completing)$' <<<"$state")" -eq "${#NODES[@]}" ]; do
    # A node DOWN from an earlier run (its container stopped) comes back once it answers.
    if grep -Eq 'down|drain|fail' <<<"$state" && [ $((waited % 5)) -eq 4 ]; then
      for node in "${NODES[@]}"; do
        SLURM_CONF="$CONF" scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
      done
    fi
    if [ "$waited" -ge 60 ]; then
      for node in "${NODES[@]}"; do
        printf -- '--- %s: docker logs, slurmd.log (tail)\n' "$node" >&2
        docker logs --tail 20 "$node" >&2 2>&1 || true
        tail -n 20 "$LOGS/$node/slurmd.log" >&2 2>/dev/null || true
      done
      die "nodes: partition two is not idle after 60 s: $(tr '\n' ' ' <<<"$state")"
    fi
    sleep 1
    waited=$((waited + 1))
  done
}

if [ "${1:-}" = "--down" ]; then
  down
  exit 0
fi
start=$SECONDS
ensure_host_packages
ensure_shared
ensure_image
ensure_network
ensure_controller
ensure_nodes
log "nodes: ready in $((SECONDS - start))s: $(SLURM_CONF="$CONF" sinfo -h -N -o '%N %T' | tr '\n' ' ')"
