# shellcheck shell=bash
# Shared helpers for the runner set-up scripts. Source it; do not execute it.

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

# Run a command as root: directly when we are root, through sudo otherwise.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "need root (or sudo) to run: $*"
  fi
}

# install_epilog DEST RUNNER_CMD: scripts/slurm-epilog.sh as DEST (root's, 0755), its RUNNER line
# set to RUNNER_CMD; replaced whole (a new file moved into place), never half written.
install_epilog() {
  local dest="$1" cmd="$2"
  sed "s|^RUNNER=.*|RUNNER=\"$cmd\"|" "$(dirname "${BASH_SOURCE[0]}")/slurm-epilog.sh" \
    | as_root tee "$dest.new" >/dev/null
  as_root chmod 0755 "$dest.new"
  as_root mv "$dest.new" "$dest"
}

_APT_UPDATED=0
# apt_install PKG...: install Debian packages, running 'apt-get update' at most once per
# process and only when the first install attempt fails (stale or empty package lists).
apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install manually: $*"
  log "apt: installing $*"
  # Fresh images (and CI runners) often ship without package lists: update first then.
  if [ "$_APT_UPDATED" -eq 0 ] \
    && [ -z "$(find /var/lib/apt/lists -maxdepth 1 -type f -name '*_Packages*' -print -quit 2>/dev/null)" ]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    _APT_UPDATED=1
  fi
  if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; then
    [ "$_APT_UPDATED" -eq 0 ] || die "apt-get install $* failed"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    _APT_UPDATED=1
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
  fi
}
