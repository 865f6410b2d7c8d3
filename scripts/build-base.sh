#!/usr/bin/env bash
# Build the offline base image (default tag runner-base:bookworm) without any registry:
#   debootstrap --variant=minbase --include=python3 bookworm ROOTFS MIRROR
#   tar -C ROOTFS -c . | docker import - runner-base:bookworm
# MIRROR is the Debian mirror apt already uses on this machine (sources.list, *.list and
# deb822 *.sources), falling back to http://deb.debian.org/debian. Override with
# RUNNER_DEBIAN_MIRROR. Needs root (or sudo) and a running Docker engine.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

TAG="${1:-runner-base:bookworm}"
SUITE="bookworm"
FALLBACK_MIRROR="http://deb.debian.org/debian"

# Print the first Debian archive URI that serves $SUITE itself (not -security/-updates).
find_mirror() {
  local f files=()
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] && files+=("$f")
  done
  [ "${#files[@]}" -gt 0 ] || return 0
  awk -v suite="$SUITE" '
    function emit(u) { sub(/\/+$/, "", u); print u; found = 1; exit }
    # deb822 stanza: remember URIs/Suites/Types/Enabled, decide at the blank line.
    function flush() {
      if (types ~ /(^| )deb( |$)/ && enabled !~ /^[Nn]o/ && (" " suites " ") ~ (" " suite " ")) {
        n = split(uris, u, /[ \t]+/)
        for (i = 1; i <= n; i++) if (u[i] ~ /^https?:\/\//) emit(u[i])
      }
      types = uris = suites = enabled = ""
    }
    # A new file ends the last stanza of the previous one (mawk has no ENDFILE).
    FNR == 1 { if (prev ~ /\.sources$/) flush(); prev = FILENAME }
    FILENAME ~ /\.sources$/ {
      if ($0 ~ /^[ \t]*$/) { flush(); next }
      if ($0 ~ /^[ \t]*#/) next
      key = tolower($1)
      val = $0; sub(/^[^:]*:[ \t]*/, "", val)
      if (key == "types:") types = val
      else if (key == "uris:") uris = val
      else if (key == "suites:") suites = val
      else if (key == "enabled:") enabled = val
      next
    }
    # one-line style: deb [options] uri suite component...
    $1 == "deb" {
      i = 2
      if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
      if ($(i) ~ /^https?:\/\// && $(i + 1) == suite) emit($(i))
    }
    END { if (!found && prev ~ /\.sources$/) flush() }
  ' "${files[@]}" 2>/dev/null || true
}

MIRROR="${RUNNER_DEBIAN_MIRROR:-$(find_mirror)}"
MIRROR="${MIRROR:-$FALLBACK_MIRROR}"

command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap
docker info >/dev/null 2>&1 || die "base: Docker engine not reachable"

WORK="$(mktemp -d "${TMPDIR:-/var/tmp}/runner-base.XXXXXX")"
ROOTFS="$WORK/rootfs"
cleanup() {
  local m
  # debootstrap mounts proc/sys inside the target; never recurse into a live mount.
  for m in dev/pts dev/shm proc sys; do
    if mountpoint -q "$ROOTFS/$m" 2>/dev/null; then as_root umount -l "$ROOTFS/$m" || true; fi
  done
  as_root rm -rf --one-file-system "$WORK"
}
trap cleanup EXIT

log "base: debootstrap --variant=minbase --include=python3 $SUITE from $MIRROR"
if ! as_root debootstrap --variant=minbase --include=python3 "$SUITE" "$ROOTFS" "$MIRROR" \
  >"$WORK/debootstrap.log" 2>&1; then
  tail -n 30 "$WORK/debootstrap.log" >&2 || true
  [ -r "$ROOTFS/debootstrap/debootstrap.log" ] && tail -n 30 "$ROOTFS/debootstrap/debootstrap.log" >&2
  die "base: debootstrap failed"
fi

log "base: trimming rootfs ($(as_root du -sh "$ROOTFS" | cut -f1) before)"
# shellcheck disable=SC2016  # expanded by the inner sh
as_root sh -eu -c '
  cd "$1"
  rm -rf var/lib/apt/lists/* var/cache/apt/*.bin var/cache/apt/archives/*.deb \
         var/cache/apt/archives/partial/* var/cache/debconf/*-old var/lib/dpkg/*-old \
         usr/share/man/* usr/share/info/* usr/share/lintian/* usr/share/linda/* \
         var/log/* tmp/* var/tmp/* debootstrap
  # Keep the copyright files, drop the rest of the docs and all translations. Keep the
  # __pycache__ dirs py3compile made: without them python3 starts ~200 ms slower.
  find usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete
  find usr/share/doc -mindepth 1 -type d -empty -delete
  find usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
  # Host-specific files debootstrap copied in; Docker provides its own at run time.
  : > etc/resolv.conf
  : > etc/hostname
  rm -f etc/machine-id var/lib/dbus/machine-id
' sh "$ROOTFS"
log "base: rootfs is $(as_root du -sh "$ROOTFS" | cut -f1) after trimming"

# Pack to a file first so a failed tar never leaves a half-imported tagged image.
log "base: importing as $TAG"
as_root tar -C "$ROOTFS" --numeric-owner --one-file-system -cf "$WORK/rootfs.tar" .
docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  --change "LABEL org.opencontainers.image.title=runner-base org.opencontainers.image.description=\"Debian $SUITE minbase + python3, built offline by scripts/build-base.sh\" org.runner.debian.mirror=$MIRROR org.runner.debian.suite=$SUITE" \
  --message "debootstrap --variant=minbase --include=python3 $SUITE $MIRROR" \
  "$WORK/rootfs.tar" "$TAG" >/dev/null
log "base: $TAG is $(docker image inspect --format '{{.Id}} ({{.Size}} bytes)' "$TAG")"
