"""CDI (Container Device Interface) specs: read and checked, written for NVIDIA GPUs, applied.

A CDI spec (github.com/cncf-tags/container-device-interface, ``SPEC.md``) names a device kind
(``nvidia.com/gpu``) and, per device, the edits a container needs: device nodes, mounts,
environment (and hooks, which only an engine can run). Specs live in ``/etc/cdi`` and
``/var/run/cdi`` (the later folder wins for a device named in both), as JSON or YAML.

How a GPU reaches a job's container (:func:`inject`), in this order:

* ``cdi-native``: the engine reads CDI specs itself (Docker 25+ with the ``cdi`` feature,
  Podman); the runner asks for ``nvidia.com/gpu=<uuid>`` by name.
* ``nvidia-runtime``: the engine has the NVIDIA runtime or the container toolkit's hook; the
  runner asks for the device ids as before.
* ``cdi-applied``: neither (Debian's Docker 20.10 on a host without the toolkit): the runner
  applies the spec's edits through the engine's plain settings: each device node with its
  cgroup rule, every mount read-only, the environment. Where no spec on the host describes
  the GPUs, one is generated from NVML's report and the loader cache (:func:`generate`), the
  way ``nvidia-ctk cdi generate`` would, but without hooks: the driver's libraries are mounted
  under their loader-cache names and ``LD_LIBRARY_PATH`` names their folders.

Every spec is checked against the CDI JSON Schema (vendored, ``cdi-spec.schema.json``) and
against the version it declares: a spec that uses a field newer than its ``cdiVersion`` is
refused, as the reference implementation refuses it. Any problem is :class:`GpuUnavailable`
naming the file and the field (a contract that allows it falls back to CPU).

Long on purpose: the CDI format is one thing to know, so reading, checking, writing and
applying it stay in one module.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from runner.backends.types import DeviceEdits, DeviceNode
from runner.core.errors import GpuUnavailable
from runner.core.safefs import UnsafePath, read_named

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    import jsonschema_rs

    from runner.backends.base import Backend
    from runner.gpu.gpus import Gpu

__all__ = [
    "KIND",
    "MAX_SPEC_BYTES",
    "SPEC_DIRS",
    "Spec",
    "apply",
    "check",
    "dump",
    "find",
    "generate",
    "host_ldcache",
    "inject",
    "names_for",
    "parse",
    "parse_ldcache",
    "registry",
    "required_version",
]

SPEC_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
"""Where specs are read from, lowest priority first (the CDI default)."""
KIND = "nvidia.com/gpu"
VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
"""The CDI versions this reader knows, oldest first (0.1.0 and 0.2.0 predate the schema)."""
GENERATED_VERSION = "0.5.0"
"""What :func:`generate` declares: device names that start with a digit need 0.5.0."""
MAX_SPEC_BYTES = 4 * 1024 * 1024
DRIVER_SEARCH_DIRS = ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib")
"""Folders searched for driver libraries besides the loader cache (where GPU cloud images and
the device plugin put them, often not in ``ld.so.conf``)."""
SMI_CONTAINER_PATH = "/usr/bin/nvidia-smi"
_SPEC_SUFFIXES = (".json", ".yaml", ".yml")
_KIND = re.compile(
    r"^[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?/[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$"
)
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=", re.DOTALL)
DRIVER_LIBRARY = re.compile(
    r"^lib(?:cuda|cudadebugger|nvcuvid|nvoptix|nvidia-[a-z0-9-]+)\.so(?:\.[0-9.]+)?$"
)
"""The driver's user-space libraries (libcuda, libnvidia-ml, libnvidia-ptxjitcompiler, ...)."""
_FULL_VERSION = re.compile(r"\.so\.[0-9]+\.[0-9]+(?:\.[0-9]+)?$")
_REQUIRED_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")
_HINT = (
    "fix or remove the spec (`runner gpu cdi --output /etc/cdi/nvidia.yaml` writes one for "
    "this host's GPUs)"
)


@dataclass(frozen=True)
class Spec:
    """One checked CDI spec."""

    source: str
    """The file it came from, or how it was made."""
    version: str
    kind: str
    edits: dict[str, Any]
    """The edits every device of the spec brings (``containerEdits`` at the top)."""
    devices: dict[str, dict[str, Any]]
    """Per device name, its ``containerEdits``."""
    raw: dict[str, Any] = field(repr=False)


def _refuse(source: str, problem: str) -> GpuUnavailable:
    return GpuUnavailable(f"the CDI spec {source}: {problem}", hint=_HINT)


@cache
def _validator() -> jsonschema_rs.Draft7Validator:
    import jsonschema_rs

    schema = json.loads((Path(__file__).parent / "cdi-spec.schema.json").read_text())
    return jsonschema_rs.Draft7Validator(schema)


def _version_key(version: str) -> int:
    return VERSIONS.index(version)


def required_version(data: dict[str, Any]) -> str:
    """The oldest CDI version that has every field ``data`` uses (the reference
    implementation's ``MinimumRequiredVersion``)."""
    all_edits = [data.get("containerEdits") or {}]
    all_edits += [d.get("containerEdits") or {} for d in data.get("devices") or []]
    devices = data.get("devices") or []
    rdt: list[dict[str, Any]] = [e["intelRdt"] for e in all_edits if e.get("intelRdt") is not None]
    if any(e.get("netDevices") for e in all_edits) or any(
        r.get("schemata") is not None or r.get("enableMonitoring") for r in rdt
    ):
        return "1.1.0"
    if rdt or any(e.get("additionalGids") for e in all_edits):
        return "0.7.0"
    _, _, kind_class = str(data.get("kind", "")).partition("/")
    if data.get("annotations") or any(d.get("annotations") for d in devices) or "." in kind_class:
        return "0.6.0"
    if any(str(d.get("name", ""))[:1].isdigit() for d in devices) or any(
        n.get("hostPath") for e in all_edits for n in e.get("deviceNodes") or []
    ):
        return "0.5.0"
    if any(m.get("type") for e in all_edits for m in e.get("mounts") or []):
        return "0.4.0"
    return "0.3.0"


def check(data: object, source: str) -> Spec:
    """``data`` (a parsed spec) checked: the schema, the version it declares (known, and new
    enough for the fields it uses), the kind and every device name (unique)."""
    errors = sorted(_validator().iter_errors(data), key=lambda e: list(e.instance_path))
    if errors:
        where = "/".join(str(p) for p in errors[0].instance_path) or "(top)"
        raise _refuse(source, f"does not match the CDI schema at {where}: {errors[0].message}")
    if not isinstance(data, dict):  # the schema says "type": "object"; for the type checker
        raise _refuse(source, "is not an object")
    version = str(data["cdiVersion"]).removeprefix("v")
    if version not in VERSIONS:
        raise _refuse(
            source,
            f"cdiVersion {data['cdiVersion']!r} is not one this runner knows "
            f"({', '.join(VERSIONS)})",
        )
    needed = required_version(data)
    if _version_key(needed) > _version_key(version):
        raise _refuse(
            source, f"uses fields of CDI {needed} but declares cdiVersion {version}; declare "
            f"{needed} or newer",
        )  # fmt: skip
    kind = str(data["kind"])
    if not _KIND.fullmatch(kind):
        raise _refuse(source, f"kind {kind!r} is not vendor/class (like {KIND})")
    devices: dict[str, dict[str, Any]] = {}
    for device in data["devices"]:
        name = str(device["name"])
        if not _DEVICE_NAME.fullmatch(name):
            raise _refuse(source, f"device name {name!r} is not a CDI device name")
        if name in devices:
            raise _refuse(source, f"names the device {name!r} twice")
        devices[name] = device["containerEdits"]
    return Spec(source, version, kind, data.get("containerEdits") or {}, devices, data)


def parse(text: bytes, source: str) -> Spec:
    """A spec from its JSON or YAML bytes (YAML by ``source``'s suffix), checked."""
    if source.endswith((".yaml", ".yml")):
        import yaml  # only where a YAML spec is read

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise _refuse(source, f"is not valid YAML: {exc}") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise _refuse(source, f"is not valid JSON: {exc}") from None
    return check(data, source)


def load(path: Path) -> Spec:
    """The spec in the file ``path`` (a regular file of at most 4 MiB)."""
    try:
        text = read_named(path, MAX_SPEC_BYTES)
    except UnsafePath as exc:
        raise _refuse(str(path), str(exc)) from None
    except OSError as exc:
        raise _refuse(str(path), f"cannot be read ({exc.strerror})") from None
    return parse(text, str(path))


def find(dirs: Iterable[Path] = SPEC_DIRS) -> list[Spec]:
    """Every spec in ``dirs`` (lowest priority first; in a folder, by file name); a folder
    that does not exist holds none."""
    found = []
    for folder in dirs:
        try:
            names = sorted(os.listdir(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise _refuse(str(folder), f"the folder cannot be listed ({exc.strerror})") from None
        found += [load(folder / n) for n in names if n.endswith(_SPEC_SUFFIXES)]
    return found


def registry(specs: Sequence[Spec]) -> dict[str, tuple[Spec, dict[str, Any]]]:
    """Fully qualified device names (``nvidia.com/gpu=0``) to their spec and edits; a later
    spec overrides an earlier one (``/var/run/cdi`` over ``/etc/cdi``)."""
    out: dict[str, tuple[Spec, dict[str, Any]]] = {}
    for spec in specs:
        for name, edits in spec.devices.items():
            out[f"{spec.kind}={name}"] = (spec, edits)
    return out


def names_for(specs: Sequence[Spec], chosen: Sequence[Gpu], kind: str = KIND) -> list[str] | None:
    """The CDI names of ``chosen`` (by UUID where a spec names it so, else by index); None
    when some GPU is described by no spec."""
    known = registry(specs)
    out = []
    for gpu in chosen:
        name = next((n for n in (f"{kind}={gpu.uuid}", f"{kind}={gpu.index}") if n in known), None)
        if name is None:
            return None
        out.append(name)
    return out


# -- applying a spec without the engine's help ------------------------------------------------


def _absolute(source: str, what: str, path: object) -> str:
    text = str(path)
    pure = PurePosixPath(text)
    if not pure.is_absolute() or ".." in pure.parts or "\0" in text:
        raise _refuse(source, f"{what} {text!r} is not an absolute path without '..'")
    return str(pure)


def _node(source: str, node: dict[str, Any]) -> DeviceNode:
    path = _absolute(source, "the device node path", node["path"])
    host = _absolute(source, "the device node hostPath", node.get("hostPath") or path)
    try:
        mode = os.stat(host).st_mode
    except OSError as exc:
        raise _refuse(source, f"the device node {host} cannot be found ({exc.strerror})") from None
    if not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)):
        raise _refuse(source, f"the device node {host} is not a device (a character or block "
                      "device is needed)")  # fmt: skip
    permissions = str(node.get("permissions") or "rwm")
    if not permissions or set(permissions) - set("rwm"):
        raise _refuse(source, f"the device node {path}: permissions {permissions!r} is not r, "
                      "w, m or a combination")  # fmt: skip
    return DeviceNode(host, path, permissions)


def _mount(source: str, mount: dict[str, Any]) -> tuple[str, str]:
    host = _absolute(source, "the mount hostPath", mount["hostPath"])
    target = _absolute(source, "the mount containerPath", mount["containerPath"])
    if mount.get("type") not in (None, "", "bind"):
        raise _refuse(source, f"the mount of {host} has type {mount['type']!r}; only bind "
                      "mounts can be applied without a CDI-aware engine")  # fmt: skip
    if not os.path.exists(host):
        raise _refuse(source, f"the mount's hostPath {host} does not exist")
    return host, target


def apply(specs: Sequence[Spec], names: Sequence[str]) -> DeviceEdits:
    """The ``cdi-applied`` edits for the devices ``names``: their nodes (each a real device
    on this host), their mounts (each made read-only), their environment, the spec-level edits
    once per spec. Hooks, network devices, Intel RDT and extra groups need a CDI-aware engine
    and are refused, as is a name no spec has."""
    known = registry(specs)
    nodes: dict[str, DeviceNode] = {}
    mounts: dict[str, tuple[str, str]] = {}
    env: dict[str, str] = {}
    seen: list[Spec] = []
    for name in names:
        if name not in known:
            where = ", ".join(str(d) for d in SPEC_DIRS)
            raise GpuUnavailable(
                f"no CDI spec names the device {name}",
                hint=f"write one (`runner gpu cdi --output /etc/cdi/nvidia.yaml`) into {where}",
            )
        spec, edits = known[name]
        todo = [edits] if spec in seen else [spec.edits, edits]
        seen.append(spec)
        for one in todo:
            for unsupported in ("hooks", "netDevices", "intelRdt", "additionalGids"):
                if one.get(unsupported):
                    raise _refuse(spec.source, f"{name} needs {unsupported}, which only a "
                                  "CDI-aware engine can apply")  # fmt: skip
            for raw in one.get("deviceNodes") or []:
                node = _node(spec.source, raw)
                nodes[node.container_path] = node
            for raw in one.get("mounts") or []:
                host, target = _mount(spec.source, raw)
                mounts[target] = (host, target)
            for entry in one.get("env") or []:
                if not _ENV.match(entry) or "\0" in entry:
                    raise _refuse(spec.source, f"{name}: environment entry {entry!r} is not "
                                  "NAME=value")  # fmt: skip
                key, _, value = entry.partition("=")
                env[key] = value
    return DeviceEdits(
        "cdi-applied",
        cdi_devices=tuple(names),
        nodes=tuple(nodes.values()),
        mounts=tuple(mounts.values()),
        env=tuple(env.items()),
    )


def inject(
    backend: Backend,
    chosen: Sequence[Gpu],
    dirs: Iterable[Path] = SPEC_DIRS,
    make_spec: Callable[[Sequence[Gpu]], dict[str, Any]] | None = None,
) -> DeviceEdits:
    """How ``chosen`` reach the container on ``backend`` (see the module's docstring).
    ``make_spec``: the generator used when no spec describes them (the live host's by
    default)."""
    native = backend.cdi_native()
    if not native and backend.gpu_capable():  # no spec is read: none can stand in its way
        return DeviceEdits("nvidia-runtime")
    specs = find(dirs)
    names = names_for(specs, chosen)
    if names is not None and native:
        return DeviceEdits("cdi-native", cdi_devices=tuple(names))
    if backend.gpu_capable():
        return DeviceEdits("nvidia-runtime")
    if names is None:
        source = "generated from NVML for this host"
        specs = [check((make_spec or host_spec)(chosen), source)]
        names = names_for(specs, chosen)
        if names is None:
            raise _refuse(source, "does not name the GPUs allotted to the job")
    return apply(specs, names)


# -- generating a spec for NVIDIA GPUs ---------------------------------------------------------


@dataclass(frozen=True)
class CacheEntry:
    """One line of ``ldconfig -p``: a library's name and the path the loader finds it at."""

    name: str
    path: str
    flags: str


def parse_ldcache(text: str) -> list[CacheEntry]:
    """``ldconfig -p`` output; 64-bit entries only (a 32-bit ``libcuda`` is of no use)."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^\s+(\S+)\s+\(([^)]*)\)(?:\s+OS ABI:[^=]*)?\s+=>\s+(/\S.*)$", line)
        if m and ("64" in m.group(2) or "AArch64" in m.group(2)):
            out.append(CacheEntry(m.group(1), m.group(3).strip(), m.group(2)))
    return out


def host_ldcache() -> str:
    """This host's loader cache (``ldconfig -p``); empty when there is no ldconfig."""
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig"):
        if os.path.exists(ldconfig):
            try:
                proc = subprocess.run(
                    [ldconfig, "-p"], capture_output=True, text=True, timeout=20, check=False
                )
            except (OSError, subprocess.TimeoutExpired):
                return ""
            return proc.stdout if proc.returncode == 0 else ""
    return ""


def _resolve(root: Path, path: str) -> str | None:
    """``path`` (absolute, as seen from ``root``) with its links followed inside ``root``;
    None unless it ends at a regular file."""
    current = PurePosixPath(path)
    for _ in range(40):
        here = root / str(current).lstrip("/")
        try:
            st = os.lstat(here)
        except OSError:
            return None
        if stat.S_ISREG(st.st_mode):
            return str(current)
        if not stat.S_ISLNK(st.st_mode):
            return None
        target = PurePosixPath(os.readlink(here))
        current = target if target.is_absolute() else current.parent / target
        current = PurePosixPath(os.path.normpath(str(current)))
    return None


def driver_libraries(
    entries: Iterable[CacheEntry],
    driver_version: str,
    root: Path = Path("/"),
    search_dirs: Iterable[str] = DRIVER_SEARCH_DIRS,
) -> list[tuple[str, str]]:
    """(host path, container path) of the driver's libraries for ``driver_version``: each
    name the loader cache (or a search folder) has for a file ``lib*.so.<version>``, the file
    mounted under that name and under its own."""
    candidates = [(e.name, e.path, False) for e in entries]
    for folder in search_dirs:
        try:
            names = sorted(os.listdir(root / folder.lstrip("/")))
        except OSError:
            continue
        candidates += [(n, f"{folder.rstrip('/')}/{n}", True) for n in names]
    suffix = f".so.{driver_version}"
    out: dict[str, str] = {}
    for name, path, driver_folder in candidates:
        if not DRIVER_LIBRARY.match(name) or path in out:
            continue
        real = _resolve(root, path)
        if real is None:
            continue
        # In a driver folder, a library copied under its soname (no version in its name) is
        # the driver's too; one of another driver version never is.
        unversioned = driver_folder and not _FULL_VERSION.search(real)
        if real.endswith(suffix) or unversioned:
            out[path] = real
            out.setdefault(real, real)
    return sorted((real, path) for path, real in out.items())


def generate(
    gpus: Sequence[Gpu],
    driver_version: str,
    ldcache: str,
    *,
    root: Path = Path("/"),
    search_dirs: Iterable[str] = DRIVER_SEARCH_DIRS,
    smi: str | None = None,
) -> dict[str, Any]:
    """A CDI spec of kind ``nvidia.com/gpu`` for ``gpus``: one device per GPU by index and by
    UUID (its node ``/dev/nvidia<minor>``) and ``all``; common edits: the control nodes that
    exist under ``root``, the driver's libraries read-only, ``nvidia-smi`` (``smi``, a path as
    seen from ``root``), ``LD_LIBRARY_PATH``. Raises GpuUnavailable when libcuda or
    libnvidia-ml for ``driver_version`` is not found."""
    if not gpus:
        from runner.gpu.gpus import none_found

        raise GpuUnavailable(f"no GPU to write a CDI spec for ({none_found()})",
                             hint="run it on a host with NVIDIA GPUs and their driver")  # fmt: skip
    libraries = driver_libraries(parse_ldcache(ldcache), driver_version, root, search_dirs)
    have = {PurePosixPath(target).name for _, target in libraries}
    missing = [n for n in _REQUIRED_LIBRARIES if not any(h.startswith(n) for h in have)]
    if missing:
        raise GpuUnavailable(
            f"the NVIDIA driver's {' and '.join(missing)} for driver {driver_version} are in "
            f"neither the loader cache nor {', '.join(search_dirs)}",
            hint="install the driver's user-space libraries (or add their folder to "
            "/etc/ld.so.conf.d and run ldconfig)",
        )
    options = ["ro", "nosuid", "nodev", "bind"]
    mounts = [{"hostPath": h, "containerPath": c, "options": options} for h, c in libraries]
    if smi is not None:
        real = _resolve(root, smi)
        if real is not None:
            mounts.append({"hostPath": real, "containerPath": SMI_CONTAINER_PATH,
                           "options": options})  # fmt: skip
    control = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
    nodes = [{"path": p} for p in control if os.path.exists(root / p.lstrip("/"))]
    folders = sorted({str(PurePosixPath(c).parent) for _, c in libraries})
    devices = []
    for gpu in gpus:
        edits = {"deviceNodes": [{"path": f"/dev/nvidia{gpu.device_number}"}]}
        devices += [
            {"name": str(gpu.index), "containerEdits": edits},
            {"name": gpu.uuid, "containerEdits": edits},
        ]
    every = [{"path": f"/dev/nvidia{g.device_number}"} for g in gpus]
    devices.append({"name": "all", "containerEdits": {"deviceNodes": every}})
    return {
        "cdiVersion": GENERATED_VERSION,
        "kind": KIND,
        "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void", f"LD_LIBRARY_PATH={':'.join(folders)}"],
            "deviceNodes": nodes,
            "mounts": mounts,
        },
    }


def host_spec(gpus: Sequence[Gpu]) -> dict[str, Any]:
    """:func:`generate` for this host: its loader cache, its ``nvidia-smi``."""
    import shutil

    if not gpus:
        return generate(gpus, "", "")
    return generate(gpus, gpus[0].driver_version, host_ldcache(), smi=shutil.which("nvidia-smi"))


def dump(spec: dict[str, Any], fmt: str) -> str:
    """The spec as ``json`` or ``yaml`` text."""
    if fmt == "json":
        return json.dumps(spec, indent=2) + "\n"
    import yaml

    class Plain(yaml.SafeDumper):
        """No anchors and aliases: every device's edits written out, as other tools expect."""

        def ignore_aliases(self, data: Any) -> bool:
            return True

    return str(yaml.dump(spec, Dumper=Plain, sort_keys=False))
