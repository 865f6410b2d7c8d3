#!/usr/bin/env bash
# Prepare everything the runner's tests need, idempotently:
#   1. a running Docker engine (installs docker.io and starts dockerd when needed),
#   2. a Python venv at .venv: requirements/dev.lock (every dependency and extra, pinned with
#      hashes; scripts/lock.sh writes it), then the project in editable mode without deps,
#   3. the base image runner-base:bookworm (built offline with debootstrap) or
#      $RUNNER_BASE_IMAGE when set (a pinned public base, pulled if missing),
#   4. the job image runner-cpu:local, built with no network,
#   4b. the agent images: runner-agent-scripted:local (the scripted agent runtime) and
#      runner-agent-claude:local (Claude Code's pinned native binary, fetched from the npm
#      registry on the host and integrity-checked, then built with no network),
#   5. docker-registry (Debian's), which the image tests run on 127.0.0.1, and htpasswd
#      (apache2-utils) for the one that requires basic auth,
#   6. gVisor's runsc (Debian's), registered with the engine as the runtime "runsc",
#   7. the egress proxy image runner-proxy:local, built with no network: the runner's proxy
#      (Python, on the base's python3), Debian's busybox-static and iptables (downloaded on the
#      host with apt-get download).
# Safe to run many times; reruns are fast (stamp file, existing images, layer cache).
#   scripts/setup.sh          everything the test command needs (1-7, Podman and Slurm)
#   scripts/setup.sh --demo   only what the toy run needs (1-4, without the agent images)
#
# Environment:
#   RUNNER_BASE_IMAGE     use this base instead of building runner-base:bookworm offline
#                         (e.g. python:3.11-slim-bookworm@sha256:<digest>)
#   RUNNER_DOCKERD_LOG    dockerd log file (default /var/log/runner-dockerd.log)
#   RUNNER_DOCKERD_ARGS   extra arguments for dockerd when this script starts it
#   RUNNER_DOCKERD_WAIT   seconds to wait for the engine (default 60)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

BASE_TAG="runner-base:bookworm"
JOB_TAG="runner-cpu:local"
PROXY_TAG="runner-proxy:local"
PROXY_DEBS="$ROOT/images/proxy/debs"
VENV="$ROOT/.venv"
STAMP="$VENV/.runner-install-stamp"
LOCK="$ROOT/requirements/dev.lock"
DOCKERD_LOG="${RUNNER_DOCKERD_LOG:-/var/log/runner-dockerd.log}"
DOCKERD_WAIT="${RUNNER_DOCKERD_WAIT:-60}"

# --------------------------------------------------------------------------- engine
engine_up() { docker info >/dev/null 2>&1; }

dockerd_pid() {
  local pid
  pid="$(cat /var/run/docker.pid 2>/dev/null || true)"
  if [ -n "$pid" ] && [ -d "/proc/$pid" ]; then
    echo "$pid"
  fi
}

# Any dockerd process at all (no pgrep: procps is not always installed).
dockerd_running() { grep -qsx dockerd /proc/[0-9]*/comm; }

show_dockerd_log() {
  if [ -r "$DOCKERD_LOG" ]; then
    printf -- '---- last lines of %s ----\n' "$DOCKERD_LOG" >&2
    tail -n 40 "$DOCKERD_LOG" >&2 || true
    printf -- '----\n' >&2
  else
    as_root tail -n 40 "$DOCKERD_LOG" >&2 || true
  fi
}

ensure_engine() {
  if engine_up; then
    log "engine: reusing running dockerd ($(docker info --format '{{.ServerVersion}}, {{.Driver}}, cgroup v{{.CgroupVersion}}' 2>/dev/null || echo '?'))"
    return 0
  fi
  if [ "$(id -u)" -ne 0 ] && command -v docker >/dev/null 2>&1 && as_root docker info >/dev/null 2>&1; then
    die "engine: dockerd runs but user $(id -un) cannot reach it; add it to the 'docker' group (then log in again) or run as root"
  fi
  if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    log "engine: docker not installed, installing docker.io"
    apt_install docker.io
  fi

  local pid
  pid="$(dockerd_pid)"
  if [ -n "$pid" ]; then
    log "engine: dockerd (pid $pid) is running but not answering yet; waiting"
  else
    log "engine: starting dockerd in the background (log: $DOCKERD_LOG)"
    # SC2016: expanded by the inner sh. SC2086: RUNNER_DOCKERD_ARGS is a word list on purpose.
    # shellcheck disable=SC2016,SC2086
    as_root sh -c 'log="$1"; shift; mkdir -p "$(dirname "$log")"
      setsid nohup dockerd "$@" >>"$log" 2>&1 </dev/null &' \
      sh "$DOCKERD_LOG" ${RUNNER_DOCKERD_ARGS:-}
  fi

  local waited=0
  until engine_up; do
    if [ "$(id -u)" -ne 0 ] && as_root docker info >/dev/null 2>&1; then
      # The engine answers root (apt's package may have started it), not this user.
      die "engine: dockerd runs but user $(id -un) cannot reach it ($(docker info 2>&1 | tail -n 1)); add it to the 'docker' group (then log in again) or run as root"
    fi
    if [ "$waited" -ge "$DOCKERD_WAIT" ]; then
      show_dockerd_log
      die "engine: dockerd did not answer 'docker info' within ${DOCKERD_WAIT}s ($(docker info 2>&1 | tail -n 1))"
    fi
    # Fail fast when dockerd already died (bad storage driver, iptables, cgroups, ...).
    if [ "$waited" -ge 2 ] && ! dockerd_running; then
      show_dockerd_log
      die "engine: dockerd exited during start-up"
    fi
    sleep 1
    waited=$((waited + 1))
  done
  log "engine: dockerd up after ${waited}s ($(docker info --format '{{.ServerVersion}}, {{.Driver}}, cgroup v{{.CgroupVersion}}' 2>/dev/null || echo '?'))"
}

# --------------------------------------------------------------------------- python
venv_ok() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; }

ensure_venv() {
  if venv_ok; then
    log "venv: reusing $VENV"
  else
    if [ -e "$VENV" ]; then
      log "venv: $VENV is broken (interpreter moved?), recreating"
      rm -rf "$VENV"
    fi
    command -v python3 >/dev/null 2>&1 || apt_install python3
    log "venv: creating $VENV with $(python3 --version 2>&1)"
    local err
    if ! err="$(python3 -m venv "$VENV" 2>&1)"; then
      rm -rf "$VENV"
      if printf '%s' "$err" | grep -qiE 'ensurepip|python3(\.[0-9]+)?-venv'; then
        log "venv: ensurepip missing, installing python3-venv"
        apt_install python3-venv
        python3 -m venv "$VENV" || die "venv: 'python3 -m venv' still fails after installing python3-venv"
      else
        printf '%s\n' "$err" >&2
        die "venv: 'python3 -m venv $VENV' failed"
      fi
    fi
  fi

  local want have=""
  # The stamp covers the lock and this script's install lines too: changing either reinstalls.
  want="$( (cat pyproject.toml "$LOCK"; echo "lock-1 no-deps editable_mode=compat") | sha256sum | cut -d' ' -f1)"
  [ -r "$STAMP" ] && have="$(cat "$STAMP")"
  if [ "$want" = "$have" ]; then
    log "venv: requirements/dev.lock and the tree already installed for this pyproject.toml (${want:0:12})"
    return 0
  fi
  rm -f "$STAMP"
  # Exactly the locked versions, each checked against its hashes; a lock that does not match
  # pyproject.toml fails tests/unit/test_lock.py (scripts/lock.sh rewrites it).
  log "venv: pip install --require-hashes -r requirements/dev.lock"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install -q --require-hashes -r "$LOCK" \
    || die "venv: pip install --require-hashes -r requirements/dev.lock failed"
  # compat: the editable install is one path in a .pth file. The default import-hook finder
  # costs every Python start in this venv about 10 ms (pathlib, importlib.util, re), which
  # `runner run` handed to `runner serve` would otherwise pay on each call.
  log "venv: pip install --no-deps -e ."
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install -q --no-deps -e . \
    --config-settings editable_mode=compat \
    || die "venv: pip install --no-deps -e . failed"
  printf '%s\n' "$want" >"$STAMP"
}

# The wheel smoke test (tests/integration/test_wheel.py) installs the runner's wheel, without -e, into a
# fresh venv with no network: its dependencies and build tools come from this folder.
WHEELHOUSE="$ROOT/.wheelhouse"
ensure_wheelhouse() {
  local want have=""
  want="$( (cat pyproject.toml "$LOCK"; echo "wheelhouse-2") | sha256sum | cut -d' ' -f1)"
  [ -r "$WHEELHOUSE/.stamp" ] && have="$(cat "$WHEELHOUSE/.stamp")"
  if [ "$want" = "$have" ]; then
    log "wheelhouse: reusing $WHEELHOUSE"
    return 0
  fi
  log "wheelhouse: the locked dependencies' wheels and the build tools, for the wheel smoke test"
  rm -rf "$WHEELHOUSE" # only the locked versions: an older pyproject's wheels would win offline
  mkdir -p "$WHEELHOUSE"
  # The lock's versions (hash-checked), so the offline installs resolve to what .venv has.
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip wheel -q --require-hashes \
    -r "$LOCK" -w "$WHEELHOUSE" || die "wheelhouse: pip wheel -r requirements/dev.lock failed"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip download -q -d "$WHEELHOUSE" \
    'setuptools>=77' wheel || die "wheelhouse: could not fetch setuptools and wheel"
  printf '%s\n' "$want" >"$WHEELHOUSE/.stamp"
}

# tests/{unit,integration}/test_hostile_fetch_bundle.py installs the tree, as a user would, into a venv made by the
# distribution's own Python (/usr/bin/python3: Debian 12's 3.11.2, older than the pyenv or
# other python3 that may come first on PATH) and runs the demo's commands with it.
ensure_system_python() {
  [ -x /usr/bin/python3 ] || apt_install python3
  if /usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    log "system python: $(/usr/bin/python3 --version 2>&1) with venv and ensurepip"
  else
    log "system python: ensurepip missing, installing python3-venv"
    apt_install python3-venv
  fi
}

# --------------------------------------------------------------------------- images
image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

ensure_base() {
  if [ -n "${RUNNER_BASE_IMAGE:-}" ]; then
    BASE="$RUNNER_BASE_IMAGE"
    if image_exists "$BASE"; then
      log "base: reusing $BASE (from RUNNER_BASE_IMAGE)"
    else
      log "base: pulling $BASE (from RUNNER_BASE_IMAGE)"
      docker pull "$BASE" >&2 || die "base: could not pull $BASE"
    fi
    return 0
  fi
  BASE="$BASE_TAG"
  if image_exists "$BASE"; then
    log "base: reusing $BASE"
  else
    log "base: $BASE missing, building it offline with debootstrap (a few minutes)"
    bash "$ROOT/scripts/build-base.sh" "$BASE"
    image_exists "$BASE" || die "base: build-base.sh finished but $BASE does not exist"
  fi
}

# Quiet unless it fails: the full build log is shown then. Every image builds with no network.
build_quietly() { # TAG CONTEXT [docker build args...]
  local tag="$1" context="$2" build_log
  shift 2
  build_log="$(mktemp)"
  if ! docker build --network none --build-arg "BASE=$BASE" "$@" -t "$tag" "$context" >"$build_log" 2>&1; then
    cat "$build_log" >&2
    rm -f "$build_log"
    die "image: docker build of $tag failed (log above)"
  fi
  rm -f "$build_log"
}

build_job_image() {
  log "image: building $JOB_TAG from images/cpu (base $BASE, --network none)"
  build_quietly "$JOB_TAG" "$ROOT/images/cpu"
}

# The egress proxy's image: Debian's busybox-static (the holder's `ip`) and iptables with the
# libraries it needs beyond the base (the holder's packet filter), fetched on the host (the
# build itself has no network) into the git-ignored images/proxy/debs/, then built like the job
# image. A package already there is kept; delete debs/ to take a newer one.
PROXY_PACKAGES=(busybox-static iptables libip4tc2 libip6tc2 libmnl0 libnetfilter-conntrack3
  libnfnetlink0 libnftnl11 libxtables12 netbase)
ensure_proxy_debs() {
  local pkg missing=()
  for pkg in "${PROXY_PACKAGES[@]}"; do
    compgen -G "$PROXY_DEBS/${pkg}_*.deb" >/dev/null || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    log "proxy: reusing $(cd "$PROXY_DEBS" && echo *.deb)"
    return 0
  fi
  command -v apt-get >/dev/null 2>&1 || die "proxy: apt-get not found; put ${missing[*]} .debs into $PROXY_DEBS"
  mkdir -p "$PROXY_DEBS"
  log "proxy: apt-get download ${missing[*]} into $PROXY_DEBS"
  # apt's sandbox user cannot write here; download as ourselves (a warning says so).
  if ! (cd "$PROXY_DEBS" && apt-get download "${missing[@]}" >/dev/null 2>&1); then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    (cd "$PROXY_DEBS" && apt-get download "${missing[@]}" >/dev/null 2>&1) \
      || die "proxy: apt-get download ${missing[*]} failed"
  fi
}

build_proxy_image() {
  ensure_proxy_debs
  log "image: building $PROXY_TAG from images/proxy (base $BASE, --network none)"
  build_quietly "$PROXY_TAG" "$ROOT/images/proxy"
}

# --------------------------------------------------------------------------- agent images
SCRIPTED_TAG="runner-agent-scripted:local"
CLAUDE_TAG="runner-agent-claude:local"
CLAUDE_DIR="$ROOT/images/agent-claude"
CLAUDE_CACHE="$ROOT/.cache/claude-code"

lock_value() { sed -n "s/^$1=//p" "$CLAUDE_DIR/claude-code.lock"; }

# The image's inputs, hashed: a build is skipped when the image carries the same hash.
inputs_hash() { (docker image inspect --format '{{.Id}}' "$BASE"; cat "$@") | sha256sum | cut -d' ' -f1; }
built_from() { docker image inspect --format '{{index .Config.Labels "org.runner.inputs"}}' "$1" 2>/dev/null || true; }

build_scripted_agent() {
  local want
  want="$(inputs_hash "$ROOT/images/agent-scripted/Dockerfile" "$ROOT/images/agent-scripted/agent.py")"
  if [ "$(built_from "$SCRIPTED_TAG")" = "$want" ]; then
    log "image: reusing $SCRIPTED_TAG"
    return 0
  fi
  log "image: building $SCRIPTED_TAG from images/agent-scripted (--network none)"
  build_quietly "$SCRIPTED_TAG" "$ROOT/images/agent-scripted" --label "org.runner.inputs=$want"
}

# The GPU smoke job (images/gpu-smoke): Python alone, the driver injected at run time; built
# here so its contract (examples/gpu-smoke) can be pinned and tested without a GPU.
GPU_SMOKE_TAG="runner-gpu-smoke:local"
build_gpu_smoke() {
  local dir="$ROOT/images/gpu-smoke" want
  want="$(inputs_hash "$dir/Dockerfile" "$dir/collect.sh" "$dir/gpu_smoke.py")"
  if [ "$(built_from "$GPU_SMOKE_TAG")" = "$want" ]; then
    log "image: reusing $GPU_SMOKE_TAG"
    return 0
  fi
  log "image: building $GPU_SMOKE_TAG from images/gpu-smoke (base $BASE, --network none)"
  build_quietly "$GPU_SMOKE_TAG" "$dir" --label "org.runner.inputs=$want"
}

# Claude Code's native binary: the npm registry tarball claude-code.lock pins, fetched on the
# host (never by a build or a job), kept in .cache/ and checked against its sha512 integrity.
fetch_claude() {
  local url integrity tarball
  url="$(lock_value url)"
  integrity="$(lock_value integrity)"
  tarball="$CLAUDE_CACHE/$(basename "$url")"
  mkdir -p "$CLAUDE_CACHE" "$CLAUDE_DIR/dist"
  "$VENV/bin/python" - "$url" "$integrity" "$tarball" "$CLAUDE_DIR/dist" <<'PY' || die "agent: could not fetch Claude Code (see above); set-up needs it"
import base64, hashlib, os, sys, tarfile, urllib.request

url, integrity, tarball, dist = sys.argv[1:5]
algorithm, _, expected = integrity.partition("-")

def digest(path):
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return base64.b64encode(h.digest()).decode()

if not (os.path.exists(tarball) and digest(tarball) == expected):
    print(f"==> agent: downloading {url}", file=sys.stderr)
    part = tarball + ".part"
    with urllib.request.urlopen(url, timeout=120) as response, open(part, "wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)
    got = digest(part)
    if got != expected:
        os.unlink(part)
        sys.exit(f"ERROR: {url} has {algorithm} {got}, the lock says {expected}")
    os.replace(part, tarball)
stamp = os.path.join(dist, ".integrity")
binary = os.path.join(dist, "claude")
current = open(stamp).read() if os.path.exists(stamp) else ""
if not os.path.exists(binary) or current != integrity:
    with tarfile.open(tarball) as tar:
        member = tar.getmember("package/claude")
        if not member.isfile():
            sys.exit("ERROR: package/claude in the tarball is not a regular file")
        with tar.extractfile(member) as src, open(binary + ".part", "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
    os.chmod(binary + ".part", 0o755)
    os.replace(binary + ".part", binary)
    with open(stamp, "w") as f:
        f.write(integrity)
PY
}

build_claude_agent() {
  fetch_claude
  local want version
  version="$(lock_value version)"
  want="$(inputs_hash "$CLAUDE_DIR/Dockerfile" "$CLAUDE_DIR/run-claude" "$CLAUDE_DIR/claude-code.lock")"
  if [ "$(built_from "$CLAUDE_TAG")" = "$want" ]; then
    log "image: reusing $CLAUDE_TAG (Claude Code $version)"
    return 0
  fi
  log "image: building $CLAUDE_TAG (Claude Code $version) from images/agent-claude (--network none)"
  build_quietly "$CLAUDE_TAG" "$CLAUDE_DIR" --build-arg "CLAUDE_CODE_VERSION=$version" \
    --label "org.runner.inputs=$want"
}

# --------------------------------------------------------------------------- test tools
# Debian's docker-registry: the tests run a real registry on 127.0.0.1 (they start it
# themselves; the package's own service is not used). htpasswd (apache2-utils) writes the
# bcrypt password file of the one that requires basic auth (tests/integration/test_registry_auth.py).
# chromium: the browser Playwright drives to open `runner report`'s page (test_report_browser.py).
ensure_test_tools() {
  if command -v docker-registry >/dev/null 2>&1; then
    log "tools: reusing docker-registry"
  else
    log "tools: installing docker-registry (a real registry for the image tests)"
    apt_install docker-registry
  fi
  if command -v htpasswd >/dev/null 2>&1; then
    log "tools: reusing htpasswd"
  else
    log "tools: installing apache2-utils (htpasswd, for the registry with basic auth)"
    apt_install apache2-utils
  fi
  if command -v chromium >/dev/null 2>&1; then
    log "tools: reusing chromium"
  else
    log "tools: installing chromium (the report page's browser test drives it with Playwright)"
    apt_install chromium
  fi
  if command -v cc >/dev/null 2>&1; then
    log "tools: reusing cc"
  else
    log "tools: installing gcc (the GPU tests build a stand-in libcuda)"
    apt_install gcc libc6-dev
  fi
}

# --------------------------------------------------------------------------- gVisor
# Debian's runsc, registered with the engine as the runtime "runsc". Jobs without network run
# under it with --network=none (gVisor's own network stack stays off).
ensure_gvisor() {
  if ! command -v runsc >/dev/null 2>&1; then
    log "gvisor: installing runsc"
    apt_install runsc
  fi
  if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; then
    log "gvisor: runsc is registered with the engine"
    return 0
  fi
  log "gvisor: registering runsc in /etc/docker/daemon.json and reloading the engine"
  as_root mkdir -p /etc/docker
  as_root python3 - "$(command -v runsc)" <<'PY'
import json, pathlib, sys
path = pathlib.Path("/etc/docker/daemon.json")
config = json.loads(path.read_text()) if path.exists() and path.read_text().strip() else {}
config.setdefault("runtimes", {})["runsc"] = {"path": sys.argv[1], "runtimeArgs": ["--network=none"]}
path.write_text(json.dumps(config, indent=2) + "\n")
PY
  local pid
  pid="$(dockerd_pid)"
  [ -n "$pid" ] || die "gvisor: cannot find dockerd's pid to reload it; restart the engine"
  as_root kill -HUP "$pid"
  local waited=0
  until docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; do
    [ "$waited" -lt 20 ] || die "gvisor: the engine did not pick up runsc (see $DOCKERD_LOG)"
    sleep 1
    waited=$((waited + 1))
  done
}

# --------------------------------------------------------------------------- main
start=$SECONDS
ensure_engine
# python3 edits /etc/docker/daemon.json in the gVisor step, before the venv step needs it too.
command -v python3 >/dev/null 2>&1 || apt_install python3
if [ "${1:-}" = "--demo" ]; then
  # What the toy run needs (scripts/demo.sh): the engine, the venv, the base and the job image.
  # The test command sets up the rest (gVisor, the registry, Podman, Slurm, the other images).
  ensure_venv
  ensure_base
  build_job_image
  log "done (demo set-up) in $((SECONDS - start))s; $JOB_TAG is $(docker image inspect --format '{{.Id}}' "$JOB_TAG")"
  exit 0
fi
ensure_gvisor
ensure_test_tools
ensure_venv
ensure_wheelhouse
ensure_system_python
ensure_base
build_job_image
build_proxy_image
build_scripted_agent
build_gpu_smoke
build_claude_agent
"$ROOT/scripts/setup_podman.sh"  # Podman, its API service, images and rootless test user
"$ROOT/scripts/setup_slurm.sh"  # a single-node Slurm for the `runner submit` tests
log "done in $((SECONDS - start))s; $JOB_TAG is $(docker image inspect --format '{{.Id}}' "$JOB_TAG")"
