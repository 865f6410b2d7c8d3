"""``runner gpu ls`` and ``runner gpu cdi``: this host's GPUs, and a CDI spec for them."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.cli._common import EXIT_SUCCEEDED, usage

if TYPE_CHECKING:
    from runner.cli._common import Subparsers
    from runner.gpu.gpus import Gpu

__all__ = ["register"]

_CDI_HELP = """\
Write a CDI spec (kind nvidia.com/gpu) for this host's GPUs, the way `nvidia-ctk cdi
generate` would but without hooks: one device per GPU by index and by UUID, plus `all`; the
device nodes (/dev/nvidiaN, nvidiactl, nvidia-uvm, nvidia-uvm-tools); the driver's libraries
for NVML's driver version, found through the loader cache (`ldconfig -p`) and
/usr/local/nvidia/lib64, mounted read-only; nvidia-smi; LD_LIBRARY_PATH.

Where a spec in the CDI folders already names every GPU, it says which and writes nothing
(--force writes anyway). The runner reads the spec at each GPU job: an engine with CDI
support applies it itself; for one without (Docker 20.10), the runner applies it.

examples:
  runner gpu cdi                                  # the spec, as YAML, on stdout
  sudo runner gpu cdi --output /etc/cdi/nvidia.yaml
  runner gpu cdi --report nvml.json --ldcache ldconfig.txt --driver-root ./root --format json
"""


def register(sub: Subparsers, name: str, help: str) -> None:
    gpu = sub.add_parser(name, help=help)
    gpu_sub = gpu.add_subparsers(dest="gpu_command", required=True, metavar="ACTION")
    ls = gpu_sub.add_parser(
        "ls",
        help="this host's GPUs (NVML, else nvidia-smi) and the jobs holding them",
        description="List the GPUs NVML (else nvidia-smi) reports, with the job that holds "
        "each device's lock. --json prints the detection report `runner gpu cdi --report` "
        "reads.",
    )
    ls.add_argument("--json", action="store_true", help="the report as JSON")
    ls.set_defaults(func=cmd_gpu_ls)
    cdi = gpu_sub.add_parser(
        "cdi",
        help="write a CDI spec for this host's NVIDIA GPUs",
        description=_CDI_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cdi.add_argument("--output", "-o", metavar="PATH", help="write it here (else stdout)")
    cdi.add_argument(
        "--format",
        choices=["yaml", "json"],
        help="default: from --output's suffix (.json: json), else yaml",
    )
    cdi.add_argument("--force", action="store_true", help="write even where a spec exists")
    cdi.add_argument(
        "--spec-dir",
        action="append",
        type=Path,
        metavar="DIR",
        help="where existing specs are looked for (repeatable; default $RUNNER_CDI_DIRS, else "
        "/etc/cdi and /var/run/cdi)",
    )
    cdi.add_argument(
        "--report",
        type=Path,
        metavar="FILE",
        help="GPUs from this `runner gpu ls --json` report instead of NVML",
    )
    cdi.add_argument(
        "--ldcache", type=Path, metavar="FILE", help="`ldconfig -p` output from this file"
    )
    cdi.add_argument(
        "--driver-root",
        type=Path,
        default=Path("/"),
        metavar="DIR",
        help="where the driver's files are (default /); the spec names them as seen from /",
    )
    cdi.add_argument("--json", action="store_true", help="a summary and the spec as JSON")
    cdi.set_defaults(func=cmd_gpu_cdi)


def _report(gpus: list[Gpu]) -> dict[str, Any]:
    return {
        "driverVersion": gpus[0].driver_version if gpus else None,
        "gpus": [asdict(g) for g in gpus],
    }


def cmd_gpu_ls(args: argparse.Namespace) -> int:
    from runner.gpu import gpus

    found = gpus.HostDetector().detect()
    lock_dir = Path(os.environ.get("RUNNER_GPU_LOCK_DIR") or gpus.HOST_LOCK_DIR)
    holders = gpus.Allocator(lock_dir, lambda _: True).holders() if lock_dir.is_dir() else {}
    if args.json:
        report = _report(found)
        for entry in report["gpus"]:
            entry["heldBy"] = holders.get(entry["uuid"], {}).get("jobDir")
        print(json.dumps(report, indent=2))
        return EXIT_SUCCEEDED
    if not found:
        print(f"no GPU ({gpus.none_found()})")
    for g in found:
        held = holders.get(g.uuid, {}).get("jobDir")
        print(f"{g.index}  {g.model}  {g.uuid}  {g.memory_bytes / 1024**3:.0f} GiB  "
              f"driver {g.driver_version}  {'held by ' + held if held else 'free'}")  # fmt: skip
    return EXIT_SUCCEEDED


def _read(path: Path, what: str) -> str:
    from runner.core.safefs import UnsafePath, read_named

    try:
        return read_named(path, 16 * 1024 * 1024).decode()
    except (UnsafePath, OSError, UnicodeDecodeError) as exc:
        usage(f"{what} {path}: {exc} (name a readable text file of at most 16 MiB)")


def _gpus_from(args: argparse.Namespace) -> list[Gpu]:
    from runner.gpu import gpus

    if args.report is None:
        return gpus.HostDetector().detect()
    try:
        data = json.loads(_read(args.report, "--report"))
        return [gpus.Gpu(**entry) for entry in data["gpus"]]
    except (ValueError, KeyError, TypeError) as exc:
        usage(f"--report {args.report}: not a detection report ({exc}); write one with "
              '`runner gpu ls --json` (an object with "gpus")')  # fmt: skip


def _write(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all (a temporary file renamed over it)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as exc:
        usage(f"--output {path}: cannot write there ({exc.strerror}); name a file in an "
              "existing folder you may write")  # fmt: skip
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cmd_gpu_cdi(args: argparse.Namespace) -> int:
    import shutil

    from runner.gpu import cdi

    found = _gpus_from(args)
    from runner.app import host

    dirs = args.spec_dir or host.cdi_dirs() or cdi.SPEC_DIRS
    specs = cdi.find(dirs)
    names = cdi.names_for(specs, found) if found else None
    if names is not None and not args.force:
        sources = sorted({cdi.registry(specs)[n][0].source for n in names})
        summary: dict[str, Any] = {"written": None, "existing": sources, "devices": names}
        if args.json:
            print(json.dumps(summary, indent=2))
        else:
            print(f"already described by {', '.join(sources)}: {', '.join(names)} "
                  "(--force writes a new spec anyway)", file=sys.stderr)  # fmt: skip
        return EXIT_SUCCEEDED
    ldcache = _read(args.ldcache, "--ldcache") if args.ldcache else cdi.host_ldcache()
    smi = shutil.which("nvidia-smi") if args.report is None else "/usr/bin/nvidia-smi"
    driver = found[0].driver_version if found else ""
    spec = cdi.generate(found, driver, ldcache, root=args.driver_root, smi=smi)
    cdi.check(spec, "generated")
    output = Path(args.output) if args.output else None
    fmt = args.format or ("json" if output and output.suffix == ".json" else "yaml")
    text = cdi.dump(spec, fmt)
    if output is not None:
        _write(output, text)
    devices = [f"{cdi.KIND}={d['name']}" for d in spec["devices"]]
    if args.json:
        summary = {"written": str(output) if output else None, "devices": devices}
        summary["spec"] = spec
        print(json.dumps(summary, indent=2))
    elif output is None:
        sys.stdout.write(text)
    else:
        print(f"wrote {output}: {', '.join(devices)}")
    return EXIT_SUCCEEDED
