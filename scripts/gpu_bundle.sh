#!/usr/bin/env bash
# Build .gpu-bundle/ (git-ignored): everything scripts/gpu_e2e.sh needs on a GPU machine that
# has no container engine, no package registry and room for at most 64 MiB beside the tree:
#
#   engine/*.xz            Debian bookworm's dockerd, containerd, containerd-shim-runc-v2,
#                          runc, tini-static (as docker-init) and libdevmapper.so.1.02.1 (which
#                          Ubuntu 24.04 lacks), from `apt-get download` + `dpkg-deb -x`, xz -9e
#   gpu-smoke-image.tar.xz `docker save` of runner-gpu-smoke:local (built offline if absent)
#   image-id               its image id (the pin)
#   site-packages.tar.xz   the runner's dependencies as CPython 3.12 manylinux x86_64 wheels
#                          (`pip download --only-binary=:all:`), unpacked: no pip needed there
#   MANIFEST               package versions, sizes, SHA-256 of every file
#
# Usage: scripts/gpu_bundle.sh [OUT]   (default OUT: .gpu-bundle; needs apt-get, dpkg-deb, xz,
# docker, and a Python with pip: $PYTHON, else .venv/bin/python, else python3)
# Then, on the GPU machine (the device tool carries the tree plus .gpu-bundle):
#   scripts/gpu_e2e.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/.gpu-bundle}"
IMAGE="runner-gpu-smoke:local"
PY_VERSION="3.12"
LIMIT_MIB=56 # 64 MiB carried in all, minus the tree (about 2 MiB) and some room
PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  for candidate in "$ROOT/.venv/bin/python" python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -m pip --version >/dev/null 2>&1; then
      PYTHON="$candidate"
      break
    fi
  done
fi
[ -n "$PYTHON" ] || { echo "gpu_bundle: no Python with pip (set PYTHON)" >&2; exit 1; }

log() { printf 'gpu_bundle: %s\n' "$*" >&2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rm -rf "$OUT"
mkdir -p "$OUT/engine"

# -- the engine: the smallest set of Debian's binaries that starts dockerd --------------------
# Compressing dockerd and containerd takes minutes here: kept in .cache/ per package versions.
PACKAGES=(docker.io containerd runc tini libdevmapper1.02.1)
versions="$(apt-cache policy "${PACKAGES[@]}" | awk '/^[^ ]/{p=$1} /Candidate:/{print p $2}')"
cache="$ROOT/.cache/gpu-bundle/engine-$(printf '%s' "$versions" | sha256sum | cut -c1-16)"
if [ ! -f "$cache/packages" ]; then
  log "engine: apt-get download ${PACKAGES[*]}"
  mkdir -p "$work/debs"
  (cd "$work/debs" && apt-get download -q "${PACKAGES[@]}" >/dev/null 2>&1)
  rm -rf "$cache.tmp"
  mkdir -p "$cache.tmp"
  for deb in "$work"/debs/*.deb; do
    dpkg-deb -x "$deb" "$work/x"
    dpkg-deb -f "$deb" Package Version | paste -sd' ' >>"$cache.tmp/packages"
  done
  pick() { # NAME PATH-IN-DEB...: the first that exists, compressed as NAME.xz
    local name="$1" path
    shift
    for path in "$@"; do
      if [ -f "$work/x/$path" ]; then
        xz -9 -T0 -c "$work/x/$path" >"$cache.tmp/$name.xz"
        return 0
      fi
    done
    echo "gpu_bundle: $name is in none of: $*" >&2
    exit 1
  }
  pick dockerd usr/sbin/dockerd usr/bin/dockerd
  pick containerd usr/bin/containerd
  pick containerd-shim-runc-v2 usr/bin/containerd-shim-runc-v2
  pick runc usr/sbin/runc usr/bin/runc
  pick docker-init usr/bin/tini-static
  pick libdevmapper.so.1.02.1 lib/x86_64-linux-gnu/libdevmapper.so.1.02.1 \
    usr/lib/x86_64-linux-gnu/libdevmapper.so.1.02.1
  rm -rf "$cache"
  mv "$cache.tmp" "$cache"
else
  log "engine: reusing $cache"
fi
cp "$cache"/*.xz "$OUT/engine/"
cp "$cache/packages" "$work/packages"

# -- the job image -------------------------------------------------------------------------------
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  log "image: building $IMAGE (offline)"
  docker build --network none -q -t "$IMAGE" "$ROOT/images/gpu-smoke" >/dev/null
fi
docker image inspect --format '{{.Id}}' "$IMAGE" >"$OUT/image-id"
log "image: docker save $IMAGE ($(cat "$OUT/image-id")) | xz"
docker save "$IMAGE" | xz -9 -T0 >"$OUT/gpu-smoke-image.tar.xz"

# -- the runner's dependencies for CPython 3.12 --------------------------------------------------
# The dependencies and the [gpu] extra (nvidia-ml-py: the GPU host's check asks NVML).
mapfile -t deps < <("$PYTHON" -c '
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["gpu"]))
' "$ROOT/pyproject.toml")
log "python: ${#deps[@]} dependencies as cp312 manylinux wheels"
# Binary wheels for CPython 3.12 where they exist; a project published only as an sdist (pure
# Python, like bagit) is built into a wheel here.
wheel_args=(--only-binary=:all: --python-version "$PY_VERSION" --implementation cp
  --abi "cp${PY_VERSION/./}" --abi abi3 --abi none
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any)
for dep in "${deps[@]}"; do
  if ! "$PYTHON" -m pip download -q "${wheel_args[@]}" -d "$work/wheels" "$dep" 2>"$work/pip.err"; then
    log "python: no wheel for $dep; building one (pure Python only)"
    "$PYTHON" -m pip wheel -q --no-deps -w "$work/wheels" "$dep" 2>>"$work/pip.err" || {
      cat "$work/pip.err" >&2
      exit 1
    }
    for built in "$work"/wheels/*.whl; do
      case "$built" in *-none-any.whl | *-abi3-* | *-cp312-*) ;; *)
        echo "gpu_bundle: $built is not for CPython $PY_VERSION on any platform" >&2
        exit 1
        ;;
      esac
    done
  fi
done
mkdir -p "$work/site"
for wheel in "$work"/wheels/*.whl; do
  "$PYTHON" -m zipfile -e "$wheel" "$work/site"
  basename "$wheel" >>"$work/wheels.txt"
done
find "$work/site" -name '__pycache__' -prune -exec rm -rf {} +
tar -C "$work/site" -cf - . | xz -9 -T0 >"$OUT/site-packages.tar.xz"

# -- what it holds ------------------------------------------------------------------------------
{
  echo "# .gpu-bundle, built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "## Debian packages"
  sort "$work/packages"
  echo "## wheels (CPython $PY_VERSION)"
  sort "$work/wheels.txt"
  echo "## files"
  (cd "$OUT" && find . -type f ! -name MANIFEST -printf '%P\n' | sort | xargs sha256sum)
} >"$OUT/MANIFEST"

total=$(du -sb "$OUT" | cut -f1)
(cd "$OUT" && find . -type f -printf '%10s  %P\n' | sort -k2) >&2
log "total $((total / 1024 / 1024)) MiB ($total bytes) in $OUT"
if [ "$total" -gt $((LIMIT_MIB * 1024 * 1024)) ]; then
  log "over the ${LIMIT_MIB} MiB this bundle may take of the 64 MiB carried"
  exit 1
fi
