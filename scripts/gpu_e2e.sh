#!/usr/bin/env bash
# The GPU smoke contract (examples/gpu-smoke) through `runner run` on a GPU machine that has
# no container engine and no registry: one H200, Ubuntu 24.04, root, cgroup v2, the NVIDIA
# driver's libraries under /usr/local/nvidia/lib64 and nvidia-smi on the PATH, Python 3.12
# without packages. Everything else comes in .gpu-bundle/ (scripts/gpu_bundle.sh, carried
# with the tree): Debian's engine binaries, the job image, the runner's dependencies.
#
#   1. unpack the engine; start containerd and dockerd of our own (own sockets and folders,
#      --iptables=false --bridge=none, overlay2); load the smoke image
#   2. `runner gpu ls`; `runner gpu cdi` writes the host's CDI spec (into a folder of the
#      run's own, named by RUNNER_CDI_DIRS; nothing under /etc is touched)
#   3. the smoke contract, pinned, through `runner run`: one GPU, injected by the runner
#      applying the spec (Docker 20.10 has no CDI); the kernel check must pass
#   4. isolation: the job sees exactly one device; a CPU-only variant sees none and its
#      nvidia-smi fails; the device lock is held while the job runs, freed after, and still
#      held after the runner is killed with SIGKILL mid-job, until a rerun finishes the job
#   5. the report: $OUT/reports/gpu/latest.md (engine, injection mode, device, figures,
#      envelope excerpt) and the raw files under $OUT/gpu-e2e/
#
# Usage (repository root, as root): scripts/gpu_e2e.sh
#   OUT=DIR          where the report goes (default ./out)
#   GPU_BUNDLE=DIR   the bundle (default .gpu-bundle)
#   E2E_REHEARSAL=1  on a machine without a GPU: a stand-in nvidia-smi and libcuda
#                    (tests/fixtures/cdi/fake_libcuda.c, needs cc) and a CDI spec of host
#                    character devices; everything else as on the GPU machine
#   E2E_PYTHON=PATH  a Python that already has the runner's dependencies (else python3 3.12
#                    with the bundle's site-packages)
# Exit 0 only when every check passed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="${GPU_BUNDLE:-$ROOT/.gpu-bundle}"
OUT_DIR="${OUT:-$ROOT/out}"
REHEARSAL="${E2E_REHEARSAL:-0}"
W="$(mktemp -d "${TMPDIR:-/tmp}/gpu-e2e.XXXXXX")"
chmod 0755 "$W"
start=$SECONDS
DOCKERD_PID=""
CONTAINERD_PID=""
: >"$W/checks.tsv"
echo "incomplete" >"$W/status"

log() { printf '[%3ss] %s\n' "$((SECONDS - start))" "$*" | tee -a "$W/e2e.log" >&2; }
check() { # NAME PASS|FAIL DETAIL
  printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$W/checks.tsv"
  log "check: $1: $2 ($3)"
}
die() {
  log "FAILED: $*"
  echo "failed: $*" >"$W/status"
  exit 1
}

# shellcheck disable=SC2329 # run by the EXIT trap
finish() {
  local rc=$?
  set +e
  if [ -n "$DOCKERD_PID" ] && kill -0 "$DOCKERD_PID" 2>/dev/null; then
    kill -TERM "$DOCKERD_PID"
    for _ in $(seq 1 40); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$DOCKERD_PID" 2>/dev/null
  fi
  if [ -n "$CONTAINERD_PID" ] && kill -0 "$CONTAINERD_PID" 2>/dev/null; then
    kill -TERM "$CONTAINERD_PID"
    for _ in $(seq 1 20); do kill -0 "$CONTAINERD_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$CONTAINERD_PID" 2>/dev/null
  fi
  if [ "$rc" -eq 0 ] && ! grep -q $'\tFAIL\t' "$W/checks.tsv"; then
    echo "passed" >"$W/status"
  elif [ "$(cat "$W/status")" = "incomplete" ]; then
    echo "failed (exit $rc)" >"$W/status"
  fi
  log "done: $(cat "$W/status")"
  mkdir -p "$OUT_DIR/reports/gpu" "$OUT_DIR/gpu-e2e"
  "${PY:-python3}" "$ROOT/scripts/gpu_report.py" "$W" "$OUT_DIR/reports/gpu/latest.md"
  tail -c 20000 "$W/dockerd.log" >"$W/dockerd.tail.log" 2>/dev/null
  for f in "$W"/*.json "$W"/*.tsv "$W"/*.log "$W"/status "$W"/cdi/*; do
    [ -f "$f" ] && [ "$f" != "$W/dockerd.log" ] && cp "$f" "$OUT_DIR/gpu-e2e/"
  done
  # The engine's data (overlay mounts are gone with dockerd) and the unpacked binaries.
  umount -R "$W/data" 2>/dev/null
  rm -rf "${W:?}/data" "${W:?}/bin" "${W:?}/site" "${W:?}/image.tar"
  exit "$rc"
}
trap finish EXIT

# -- 1. the machine ---------------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || die "run it as root (the engine needs it)"
[ -f "$BUNDLE/MANIFEST" ] || die "no bundle at $BUNDLE (make it with scripts/gpu_bundle.sh)"
if [ "$REHEARSAL" = 1 ]; then
  mkdir -p "$W/fakebin"
  cat >"$W/fakebin/nvidia-smi" <<'EOF'
#!/bin/sh
# Rehearsal stand-in: what nvidia-smi says on the device machine.
case "$*" in
  *--query-gpu*) echo "0, GPU-5c8f3a21-7d4e-9b06-e1f2-3a4b5c6d7e8f, NVIDIA H200 (rehearsal), 143771, 580.95.05" ;;
  *) echo "GPU 0: NVIDIA H200 (rehearsal) (UUID: GPU-5c8f3a21-7d4e-9b06-e1f2-3a4b5c6d7e8f)" ;;
esac
EOF
  chmod +x "$W/fakebin/nvidia-smi"
  export PATH="$W/fakebin:$PATH"
fi
command -v nvidia-smi >/dev/null || die "nvidia-smi is not on the PATH"
nvidia-smi -L >"$W/nvidia-smi.txt" 2>&1 || die "nvidia-smi -L failed: $(cat "$W/nvidia-smi.txt")"
log "host GPUs: $(paste -sd';' "$W/nvidia-smi.txt")"

if [ -n "${E2E_PYTHON:-}" ]; then
  PY="$E2E_PYTHON"
else
  PY=python3
  "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' ||
    die "the bundle's packages are for CPython 3.12; this is $("$PY" --version 2>&1) (set E2E_PYTHON)"
  mkdir -p "$W/site"
  xz -dc "$BUNDLE/site-packages.tar.xz" | tar -C "$W/site" -xf -
  export PYTHONPATH="$W/site"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c 'import runner.cli, pydantic, docker, yaml, jsonschema_rs' || die "the runner does not import"
runner() { "$PY" -m runner "$@"; }

"$PY" - "$W/facts.json" "$REHEARSAL" "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" \
  "$(paste -sd';' "$W/nvidia-smi.txt")" <<'EOF'
import json, os, platform, sys, time
os_name = "?"
try:
    for line in open("/etc/os-release"):
        if line.startswith("PRETTY_NAME="):
            os_name = line.split("=", 1)[1].strip().strip('"')
except OSError:
    pass
cgroup = "v2" if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else "v1"
json.dump({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rehearsal": sys.argv[2] == "1",
           "commit": sys.argv[3], "smi": sys.argv[4], "os": os_name, "kernel": platform.release(),
           "cgroup": cgroup, "python": platform.python_version()}, open(sys.argv[1], "w"), indent=2)
EOF

# -- the engine -----------------------------------------------------------------------------
mkdir -p "$W/bin" "$W/lib"
for f in "$BUNDLE"/engine/*.xz; do
  name="$(basename "$f" .xz)"
  case "$name" in
    *.so.*) xz -dc "$f" >"$W/lib/$name" ;;
    *) xz -dc "$f" >"$W/bin/$name" && chmod 0755 "$W/bin/$name" ;;
  esac
done
export PATH="$W/bin:$PATH"
log "engine: unpacked $(cd "$W/bin" && echo *)"
cat >"$W/containerd.toml" <<EOF
version = 2
root = "$W/containerd-root"
state = "$W/containerd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$W/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$W/containerd-opt"
EOF
LD_LIBRARY_PATH="$W/lib" containerd --config "$W/containerd.toml" >"$W/containerd.log" 2>&1 &
CONTAINERD_PID=$!
for _ in $(seq 1 60); do [ -S "$W/containerd.sock" ] && break; sleep 0.5; done
[ -S "$W/containerd.sock" ] || die "containerd did not start: $(tail -5 "$W/containerd.log")"
LD_LIBRARY_PATH="$W/lib" dockerd --containerd "$W/containerd.sock" \
  --data-root "$W/data" --exec-root "$W/exec" --pidfile "$W/dockerd.pid" \
  -H "unix://$W/docker.sock" --iptables=false --ip-masq=false --bridge=none \
  --storage-driver overlay2 >"$W/dockerd.log" 2>&1 &
DOCKERD_PID=$!
export DOCKER_HOST="unix://$W/docker.sock"
"$PY" - "$W/docker.sock" "$W/engine-version.json" <<'EOF' || die "dockerd did not answer: $(tail -5 "$W/dockerd.log")"
import http.client, json, socket, sys, time
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(sys.argv[1])
for _ in range(120):
    try:
        c = Unix("localhost", timeout=5); c.request("GET", "/version"); r = c.getresponse()
        if r.status == 200:
            open(sys.argv[2], "w").write(r.read().decode()); sys.exit(0)
    except OSError:
        pass
    time.sleep(0.5)
sys.exit(1)
EOF
log "engine: dockerd $("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["Version"])' "$W/engine-version.json") answers"

export RUNNER_STATE_DIR="$W/state" RUNNER_CONFIG_DIR="$W/config" RUNNER_SERVER=off
export RUNNER_GPU_LOCK_DIR="$W/locks" RUNNER_CDI_DIRS="$W/cdi"
xz -dc "$BUNDLE/gpu-smoke-image.tar.xz" >"$W/image.tar"
runner image load "$W/image.tar" --expect "$(cat "$BUNDLE/image-id")" >>"$W/e2e.log" 2>&1 ||
  die "the image did not load"
log "image: loaded $(cat "$BUNDLE/image-id")"

# -- 2. the GPUs and their CDI spec ---------------------------------------------------------
runner gpu ls --json >"$W/gpu-ls.json" || die "runner gpu ls failed"
mkdir -p "$W/cdi"
if [ "$REHEARSAL" = 1 ]; then
  cc -shared -fPIC -O1 -o "$W/libcuda.so.1" "$ROOT/tests/fixtures/cdi/fake_libcuda.c"
  chmod 0755 "$W/libcuda.so.1"
  uuid="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["gpus"][0]["uuid"])' "$W/gpu-ls.json")"
  cat >"$W/cdi/nvidia.json" <<EOF
{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
 "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/full"}]}},
             {"name": "$uuid", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/full"}]}}],
 "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": "/dev/null"}],
   "mounts": [{"hostPath": "$W/libcuda.so.1", "containerPath": "/usr/local/nvidia/lib64/libcuda.so.1", "options": ["ro", "nosuid", "nodev", "bind"]}],
   "env": ["LD_LIBRARY_PATH=/usr/local/nvidia/lib64", "NVIDIA_VISIBLE_DEVICES=void"]}}
EOF
  log "cdi: rehearsal spec (stand-in libcuda, /dev/full as /dev/nvidia0)"
else
  runner gpu cdi --output "$W/cdi/nvidia.yaml" >>"$W/e2e.log" 2>&1 || die "runner gpu cdi failed"
  log "cdi: wrote $W/cdi/nvidia.yaml ($(grep -c 'containerPath' "$W/cdi/nvidia.yaml") mounts)"
fi

# -- 3. the smoke contract --------------------------------------------------------------------
variant() { # NAME PYTHON-EXPRESSION-ON-d: a re-digested copy of the contract, pinned
  "$PY" - "$ROOT/examples/gpu-smoke/task.json" "$W/$1.json" "$2" <<'EOF'
import json, sys
from runner.contract import with_digest
d = json.load(open(sys.argv[1])); d.pop("contractDigest")
exec(sys.argv[3])
json.dump(with_digest(d), open(sys.argv[2], "w"), indent=2)
EOF
  runner pin "$W/$1.json" --image runner-gpu-smoke:local -o "$W/$1.pinned.json" >/dev/null
}
lock_held() { grep -qs . "$W"/locks/*.json; }
envelope_field() { "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$@"; }

variant smoke 'pass'
( while :; do lock_held && echo held || echo free; sleep 0.2; done ) >"$W/lock-trace.txt" 2>/dev/null &
TRACER=$!
set +e
runner run "$W/smoke.pinned.json" --allow-unsigned --json >"$W/envelope.json" 2>"$W/run.log"
rc=$?
set -e
kill "$TRACER" 2>/dev/null || true
log "run: runner run exited $rc"
[ -s "$W/envelope.json" ] || die "no envelope: $(tail -5 "$W/run.log")"
job_dir="$(envelope_field "$W/envelope.json" 'd["jobDir"]')"
cp "$job_dir/output/gpu-smoke.json" "$W/evidence.json" 2>/dev/null || true
check "smoke job succeeded" "$([ "$rc" = 0 ] && echo PASS || echo FAIL)" "runner run exit $rc"
kernel="$(envelope_field "$W/envelope.json" '{m["measurementId"]: m["value"] for m in d["measurements"]}.get("gpu-kernel-check")')"
check "kernel check" "$([ "$kernel" = True ] && echo PASS || echo FAIL)" "gpu-kernel-check = $kernel"
mode="$(envelope_field "$W/envelope.json" '(d["gpus"] or [{}])[0].get("injection")')"
check "injected by the runner (no CDI in Docker 20.10)" "$([ "$mode" = cdi-applied ] && echo PASS || echo FAIL)" "injection = $mode"
count="$(envelope_field "$W/envelope.json" '{m["measurementId"]: m["value"] for m in d["measurements"]}.get("gpu-device-count")')"
check "the job sees exactly one device" "$([ "$count" = 1 ] && echo PASS || echo FAIL)" "cuDeviceGetCount = $count"
if [ "$REHEARSAL" != 1 ]; then # the stand-in spec brings no nvidia-smi
  smi_in="$(envelope_field "$W/evidence.json" 'd.get("nvidiaSmi")' 2>/dev/null || echo '?')"
  smi_n="$(envelope_field "$W/evidence.json" 'len(d["nvidiaSmi"]) if isinstance(d.get("nvidiaSmi"), list) else -1' 2>/dev/null || echo -1)"
  check "nvidia-smi inside lists exactly one GPU" "$([ "$smi_n" = 1 ] && echo PASS || echo FAIL)" "$smi_in"
fi
held="$(grep -c held "$W/lock-trace.txt" || true)"
check "device lock held while the job ran" "$([ "$held" -gt 0 ] && echo PASS || echo FAIL)" "$held of $(wc -l <"$W/lock-trace.txt") samples held"
check "device lock freed after" "$(lock_held && echo FAIL || echo PASS)" "$(cat "$W"/locks/*.json 2>/dev/null | head -c 200)"

# -- 4. isolation: no GPU, and a runner killed mid-job ------------------------------------------
variant cpu 'd["environment"]["gpu"] = "none"; d["computeRequirement"].update(gpuCount=0, cpuFallbackAllowed=True)'
set +e
runner run "$W/cpu.pinned.json" --allow-unsigned --json >"$W/envelope-cpu.json" 2>"$W/run-cpu.log"
rc=$?
set -e
cpu_dir="$(envelope_field "$W/envelope-cpu.json" 'd["jobDir"]')"
cp "$cpu_dir/output/gpu-smoke.json" "$W/evidence-cpu.json" 2>/dev/null || true
why="$(envelope_field "$W/evidence-cpu.json" 'd.get("error")' 2>/dev/null || echo '?')"
smi="$(envelope_field "$W/evidence-cpu.json" 'd.get("nvidiaSmi")' 2>/dev/null || echo '?')"
check "without a GPU the job sees none" "$(case "$why" in "no driver"*) echo PASS ;; *) echo FAIL ;; esac)" "exit $rc: $why"
check "without a GPU nvidia-smi fails inside" "$(case "$smi" in nvidia-smi:*) echo PASS ;; *) echo FAIL ;; esac)" "$smi"

variant slow 'd["protocol"].update(requiredCommandFragments=[], command=["sh", "-c", "python3 -c \"import time; time.sleep(12)\" && exec python3 /opt/gpu-smoke/gpu_smoke.py --output /job/output/gpu-smoke.json"])'
"$PY" -m runner run "$W/slow.pinned.json" --allow-unsigned --json >"$W/envelope-killed.json" 2>"$W/run-killed.log" &  # $! is the runner itself
victim=$!
for _ in $(seq 1 100); do lock_held && break; sleep 0.2; done
sleep 3
kill -KILL "$victim" 2>/dev/null || true
wait "$victim" 2>/dev/null || true
check "lock kept after kill -9 while the container runs" "$(lock_held && echo PASS || echo FAIL)" "$(cat "$W"/locks/*.json 2>/dev/null | head -c 160)"
set +e
runner run "$W/slow.pinned.json" --allow-unsigned --json >"$W/envelope-rerun.json" 2>"$W/run-rerun.log"
rc=$?
set -e
attempts="$(envelope_field "$W/envelope-rerun.json" 'len(d.get("attempts") or [])' 2>/dev/null || echo '?')"
check "rerun after kill -9 finishes the job" "$([ "$rc" = 0 ] && echo PASS || echo FAIL)" "exit $rc, $attempts attempt(s)"
check "lock freed after the rerun" "$(lock_held && echo FAIL || echo PASS)" "$(cat "$W"/locks/*.json 2>/dev/null | head -c 160)"

grep -q $'\tFAIL\t' "$W/checks.tsv" && die "some checks failed (see the report)"
exit 0
