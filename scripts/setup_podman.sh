#!/usr/bin/env bash
# Prepare Podman for the runner's Podman backend and its tests, idempotently:
#   1. Debian's podman, with what it needs here: catatonit (the init a container gets),
#      uidmap, slirp4netns and fuse-overlayfs (rootless Podman), curl (to ask the socket);
#   2. containers.conf's default nofile and nproc limits set to the engine's own (rootful
#      Podman asks for 1048576 of each, which a host that is itself a container may refuse:
#      every start then fails; Docker's containers inherit dockerd's limits the same way);
#   3. the rootful API service on unix:///run/podman/podman.sock (started when not running);
#   4. the test images in Podman's own store: `docker save | podman load` when Podman lacks
#      one, then the image ids (config digests) are checked to be the same in both engines;
#   5. the unprivileged user runner-rootless (with subordinate ids) that the rootless refusal
#      test runs `runner run` as.
# Safe to run many times: what is there and right is reused.
#
# Environment:
#   RUNNER_PODMAN_LOG     the API service's log (default /var/log/runner-podman.log)
#   RUNNER_PODMAN_IMAGES  images to copy from Docker (default: runner-cpu:local)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

SOCKET=/run/podman/podman.sock
PODMAN_LOG="${RUNNER_PODMAN_LOG:-/var/log/runner-podman.log}"
IMAGES="${RUNNER_PODMAN_IMAGES:-runner-cpu:local}"
ULIMITS=/etc/containers/containers.conf.d/runner-ulimits.conf
TEST_USER=runner-rootless

podman_packages() {
  local missing=()
  command -v podman >/dev/null 2>&1 || missing+=(podman)
  command -v catatonit >/dev/null 2>&1 || [ -x /usr/libexec/podman/catatonit ] || missing+=(catatonit)
  command -v newuidmap >/dev/null 2>&1 || missing+=(uidmap)
  command -v slirp4netns >/dev/null 2>&1 || missing+=(slirp4netns)
  command -v fuse-overlayfs >/dev/null 2>&1 || missing+=(fuse-overlayfs)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  if [ "${#missing[@]}" -gt 0 ]; then
    apt_install "${missing[@]}"
  else
    log "podman: reusing $(podman --version)"
  fi
}

service_up() { as_root curl -sf --max-time 5 --unix-socket "$SOCKET" http://podman/_ping >/dev/null 2>&1; }

service_pid() {
  local pid
  for comm in /proc/[0-9]*/comm; do
    [ "$(cat "$comm" 2>/dev/null)" = podman ] || continue
    pid="${comm#/proc/}"
    pid="${pid%/comm}"
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "system service .*unix://$SOCKET"; then
      echo "$pid"
      return 0
    fi
  done
}

start_service() {
  as_root mkdir -p "$(dirname "$SOCKET")"
  log "podman: starting the API service on unix://$SOCKET (log $PODMAN_LOG)"
  # From the socket's folder: conmon leaves an empty 'oom' file in the folder it started in.
  as_root sh -c "cd '$(dirname "$SOCKET")' && setsid podman system service --time=0 unix://$SOCKET >>'$PODMAN_LOG' 2>&1 </dev/null &"
  local waited=0
  until service_up; do
    [ "$waited" -lt 30 ] || { tail -n 20 "$PODMAN_LOG" >&2 || true; die "podman: the API service did not answer on $SOCKET"; }
    sleep 1
    waited=$((waited + 1))
  done
}

stop_service() {
  local pid
  pid="$(service_pid)"
  [ -z "$pid" ] || as_root kill "$pid"
  local waited=0
  while service_up; do
    [ "$waited" -lt 20 ] || die "podman: the API service (pid $pid) does not stop"
    sleep 1
    waited=$((waited + 1))
  done
}

# The hard limit named $2 ("Max open files", "Max processes") of process $1.
hard_limit() { awk -v n="$2" 'index($0, n) == 1 { print $(NF - 1) }' "/proc/$1/limits"; }

ensure_service() {
  service_up || start_service
  local pid nofile nproc want
  pid="$(service_pid)"
  [ -n "$pid" ] || { log "podman: the service on $SOCKET is not one this script can see; its limits are left as they are"; return 0; }
  nofile="$(hard_limit "$pid" "Max open files")"
  nproc="$(hard_limit "$pid" "Max processes")"
  want="$(printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]' "$nofile" "$nofile" "$nproc" "$nproc")"
  if [ "$(cat "$ULIMITS" 2>/dev/null)" != "$want" ]; then
    log "podman: containers get the engine's own limits (nofile $nofile, nproc $nproc) in $ULIMITS"
    as_root mkdir -p "$(dirname "$ULIMITS")"
    printf '%s\n' "$want" | as_root tee "$ULIMITS" >/dev/null
    stop_service
    start_service
  else
    log "podman: reusing the API service on $SOCKET (pid $pid)"
  fi
}

copy_images() {
  local tag docker_id podman_id
  for tag in $IMAGES; do
    docker_id="$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null)" \
      || die "podman: $tag is not in Docker's store; run scripts/setup.sh first"
    podman_id="sha256:$(as_root podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)"
    if [ "$podman_id" != "$docker_id" ]; then
      log "podman: copying $tag ($docker_id) from Docker's store"
      docker save "$tag" | as_root podman load -q >/dev/null
      podman_id="sha256:$(as_root podman image inspect --format '{{.Id}}' "$tag")"
    fi
    [ "$podman_id" = "$docker_id" ] \
      || die "podman: $tag is $podman_id under Podman and $docker_id under Docker"
    log "podman: $tag is $podman_id in both engines"
  done
}

ensure_test_user() {
  if ! id "$TEST_USER" >/dev/null 2>&1; then
    log "podman: adding the unprivileged user $TEST_USER (rootless tests)"
    as_root useradd --create-home --shell /bin/sh "$TEST_USER"
  fi
  # Its runtime folder, as a login session's systemd-logind would make it (/run is a tmpfs:
  # gone at each boot). Rootless Podman keeps the path it first ran with in its database and
  # fails ("creating events dirs") when the folder is missing.
  as_root install -d -m 0700 -o "$TEST_USER" -g "$TEST_USER" "/run/user/$(id -u "$TEST_USER")"
  if ! grep -q "^$TEST_USER:" /etc/subuid 2>/dev/null || ! grep -q "^$TEST_USER:" /etc/subgid 2>/dev/null; then
    as_root usermod --add-subuids 200000-265535 --add-subgids 200000-265535 "$TEST_USER"
  fi
}

podman_packages
ensure_service
copy_images
ensure_test_user
