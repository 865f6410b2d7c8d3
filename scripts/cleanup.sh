#!/usr/bin/env bash
# Remove leftovers of runner jobs: containers (running or not), networks and volumes
# labelled org.runner.managed=true. Images are kept. Safe to run any time.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

LABEL="org.runner.managed=true"
docker info >/dev/null 2>&1 || die "cleanup: Docker engine not reachable"

mapfile -t ids < <(docker ps -aq --filter "label=$LABEL")
if [ "${#ids[@]}" -gt 0 ]; then
  log "cleanup: removing ${#ids[@]} container(s)"
  docker rm -f -v "${ids[@]}" >/dev/null
fi
mapfile -t nets < <(docker network ls -q --filter "label=$LABEL")
if [ "${#nets[@]}" -gt 0 ]; then
  log "cleanup: removing ${#nets[@]} network(s)"
  docker network rm "${nets[@]}" >/dev/null
fi
mapfile -t vols < <(docker volume ls -q --filter "label=$LABEL")
if [ "${#vols[@]}" -gt 0 ]; then
  log "cleanup: removing ${#vols[@]} volume(s)"
  docker volume rm "${vols[@]}" >/dev/null
fi
log "cleanup: done"
