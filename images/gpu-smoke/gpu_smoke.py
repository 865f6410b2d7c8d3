"""GPU smoke test through the CUDA driver API alone (ctypes against libcuda.so.1): no CUDA
toolkit in the image, only the driver the runner injects at run time.

cuInit; the device count, name, compute capability and memory; a vector add written in PTX
(sm_80, JIT-compiled by the driver) on 1 Mi floats: allocate, copy in, launch, copy back,
check; host-to-device bandwidth from pinned memory. Writes one JSON document (--output) and a
line per step on stdout. Exit 0: the kernel's result is right; 1: it is wrong; 3: no driver
or no device (the evidence says which).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PTX = b"""\
.version 7.0
.target sm_80
.address_size 64

.visible .entry vadd(
    .param .u64 pa,
    .param .u64 pb,
    .param .u64 pc,
    .param .u32 pn
)
{
    .reg .pred %p<2>;
    .reg .f32 %f<4>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<11>;

    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [pc];
    ld.param.u32 %r2, [pn];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r1, %r2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd4, %rd1;
    cvta.to.global.u64 %rd5, %rd2;
    cvta.to.global.u64 %rd6, %rd3;
    mul.wide.u32 %rd7, %r1, 4;
    add.s64 %rd8, %rd4, %rd7;
    add.s64 %rd9, %rd5, %rd7;
    add.s64 %rd10, %rd6, %rd7;
    ld.global.f32 %f1, [%rd8];
    ld.global.f32 %f2, [%rd9];
    add.f32 %f3, %f1, %f2;
    st.global.f32 [%rd10], %f3;
DONE:
    ret;
}
"""
N = 1 << 20
BLOCK = 256
BANDWIDTH_BYTES = 256 * 1024 * 1024
BANDWIDTH_REPEATS = 5
NO_DRIVER = 3


class CudaError(Exception):
    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} returned {code} ({name})")
        self.call, self.code, self.name = call, code, name


class Driver:
    """The few driver API calls the test makes, each checked."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def error_name(self, code: int) -> str:
        name = ctypes.c_char_p()
        if self.lib.cuGetErrorName(code, ctypes.byref(name)) != 0 or not name.value:
            return "unknown"
        return name.value.decode()

    def __call__(self, call: str, *args: Any) -> None:
        code = getattr(self.lib, call)(*args)
        if code != 0:
            raise CudaError(call, code, self.error_name(code))


def smi() -> list[str] | str:
    """``nvidia-smi -L`` as the job sees it: its lines, or why it failed."""
    path = shutil.which("nvidia-smi")
    if path is None:
        return "nvidia-smi: not found"
    try:
        done = subprocess.run([path, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi: {exc}"
    if done.returncode != 0:
        return f"nvidia-smi: exit {done.returncode}: {(done.stdout + done.stderr).strip()[:500]}"
    return done.stdout.strip().splitlines()


def run(result: dict[str, Any]) -> int:
    try:
        cuda = Driver()
    except OSError as exc:
        result["error"] = f"no driver: libcuda.so.1 cannot be loaded ({exc})"
        return NO_DRIVER
    u32, i32, u64 = ctypes.c_uint32, ctypes.c_int, ctypes.c_uint64
    try:
        cuda("cuInit", 0)
    except CudaError as exc:
        result["error"] = f"no device: {exc}"
        return NO_DRIVER
    version, count, dev = i32(), i32(), i32()
    cuda("cuDriverGetVersion", ctypes.byref(version))
    cuda("cuDeviceGetCount", ctypes.byref(count))
    result["cudaDriverVersion"] = f"{version.value // 1000}.{version.value % 1000 // 10}"
    result["deviceCount"] = count.value
    print(f"cuInit ok: CUDA driver {result['cudaDriverVersion']}, {count.value} device(s)")
    cuda("cuDeviceGet", ctypes.byref(dev), 0)
    name = ctypes.create_string_buffer(256)
    cuda("cuDeviceGetName", name, 256, dev)
    major, minor, memory = i32(), i32(), ctypes.c_size_t()
    cuda("cuDeviceGetAttribute", ctypes.byref(major), 75, dev)  # compute capability major
    cuda("cuDeviceGetAttribute", ctypes.byref(minor), 76, dev)  # and minor
    cuda("cuDeviceTotalMem_v2", ctypes.byref(memory), dev)
    result["device"] = name.value.decode()
    result["computeCapability"] = f"{major.value}.{minor.value}"
    result["memoryBytes"] = memory.value
    print(f"device 0: {result['device']} (sm_{major.value}{minor.value}, {memory.value:,} bytes)")

    ctx = ctypes.c_void_p()
    cuda("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    cuda("cuCtxSetCurrent", ctx)
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    cuda("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(PTX))
    cuda("cuModuleGetFunction", ctypes.byref(function), module, b"vadd")

    floats = ctypes.c_float * N
    a = floats(*[float(i) for i in range(N)])
    b = floats(*[float(2 * (N - i)) for i in range(N)])
    c = floats()
    size = ctypes.sizeof(a)
    da, db, dc = u64(), u64(), u64()
    for ptr in (da, db, dc):
        cuda("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(size))
    cuda("cuMemcpyHtoD_v2", da, a, ctypes.c_size_t(size))
    cuda("cuMemcpyHtoD_v2", db, b, ctypes.c_size_t(size))
    n = u32(N)
    params = (ctypes.c_void_p * 4)(
        *(ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in (da, db, dc, n))
    )
    grid = (N + BLOCK - 1) // BLOCK
    started = time.perf_counter()
    cuda("cuLaunchKernel", function, u32(grid), u32(1), u32(1), u32(BLOCK), u32(1), u32(1),
         u32(0), None, params, None)  # fmt: skip
    cuda("cuCtxSynchronize")
    result["kernelSeconds"] = time.perf_counter() - started
    cuda("cuMemcpyDtoH_v2", c, dc, ctypes.c_size_t(size))
    wrong = sum(1 for i in range(N) if c[i] != a[i] + b[i])
    result["kernelElements"] = N
    result["kernelWrong"] = wrong
    result["kernelCheck"] = wrong == 0
    print(f"vadd on {N:,} floats: {'ok' if wrong == 0 else f'{wrong:,} wrong'}")

    host = ctypes.c_void_p()
    dev_buf = u64()
    cuda("cuMemAllocHost_v2", ctypes.byref(host), ctypes.c_size_t(BANDWIDTH_BYTES))
    cuda("cuMemAlloc_v2", ctypes.byref(dev_buf), ctypes.c_size_t(BANDWIDTH_BYTES))
    ctypes.memset(host, 1, BANDWIDTH_BYTES)
    cuda("cuMemcpyHtoD_v2", dev_buf, host, ctypes.c_size_t(BANDWIDTH_BYTES))  # warm-up
    cuda("cuCtxSynchronize")
    started = time.perf_counter()
    for _ in range(BANDWIDTH_REPEATS):
        cuda("cuMemcpyHtoD_v2", dev_buf, host, ctypes.c_size_t(BANDWIDTH_BYTES))
    cuda("cuCtxSynchronize")
    seconds = time.perf_counter() - started
    result["h2dGBps"] = round(BANDWIDTH_BYTES * BANDWIDTH_REPEATS / seconds / 1e9, 2)
    print(f"host to device (pinned, {BANDWIDTH_BYTES >> 20} MiB x {BANDWIDTH_REPEATS}): "
          f"{result['h2dGBps']} GB/s")  # fmt: skip
    cuda("cuMemFreeHost", host)
    for ptr in (da, db, dc, dev_buf):
        cuda("cuMemFree_v2", ptr)
    cuda("cuDevicePrimaryCtxRelease_v2", dev)
    return 0 if wrong == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, required=True, help="the evidence JSON file")
    args = parser.parse_args()
    result: dict[str, Any] = {"schema": "gpu-smoke/1", "kernelCheck": False, "nvidiaSmi": smi()}
    try:
        code = run(result)
    except CudaError as exc:
        result["error"] = str(exc)
        code = 1
    result["exitCode"] = code
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    if "error" in result:
        print(f"gpu-smoke: {result['error']}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
