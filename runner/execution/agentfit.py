"""Whether an agent runtime can run in the contract's image, read through the engine without
running anything of either image (:func:`check_fits`).

Each ELF program of the runtime must be for the image's architecture and find its dynamic
loader (``PT_INTERP``, e.g. ``/lib64/ld-linux-x86-64.so.2``) in the image, and glibc's loader
glibc itself; each script's ``#!`` interpreter (and ``#!/usr/bin/env NAME``'s NAME) must be
there; ``/bin/sh`` (the runner's own stream wrapper) and the argv's first word (``python3`` for
the scripted runtime) must be there; and so must each command the adapter's
``runtimeRequires`` names, looked up on the PATH the runtime starts with (its first
:data:`MAX_SEARCH` entries), each link in the image resolved by hand (at most 16 hops, never
leaving the image). A runtime that cannot run is refused before the attempt, naming why and the
image. Copying the runtime out of its image, its cache entry and the remembered fits are
:mod:`runner.execution.agentimage`'s.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.backends.base import Backend, ImageFiles, ImageInfo, PathStat
from runner.core.errors import InfrastructureError, PolicyViolation
from runner.images.pins import normalize_arch

if TYPE_CHECKING:
    from runner.execution.agentimage import Runtime

__all__ = [
    "DEFAULT_PATH",
    "FIT_CHECK",
    "MAX_SEARCH",
    "MOUNT",
    "Needs",
    "check_fits",
    "host_arch",
    "image_path",
    "needs_of",
    "search_path",
]

MOUNT = "/opt/runner-agent"
"""Where the runtime's files are in the contract's container (read-only)."""
FIT_CHECK = 3
"""The version of :func:`check_fits`' rules (a cached fit of older rules is not reused)."""
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The engine's PATH for an image whose configuration names none."""
_HEAD = 64 * 1024
_LINK_HOPS = 16

_ELF_MACHINES = {
    3: "386",
    8: "mips",
    20: "ppc",
    21: "ppc64le",
    22: "s390x",
    40: "arm",
    62: "amd64",
    183: "arm64",
    243: "riscv64",
}


@dataclass(frozen=True)
class Needs:
    """What one runtime program needs of the image it runs in."""

    path: str
    machine: str | None = None
    """The ELF's architecture (normalized as image architectures are)."""
    interpreter: str | None = None
    """The ELF's dynamic loader, or a script's ``#!`` interpreter."""
    interpreter_arg: str | None = None
    """``#!/usr/bin/env NAME``: the command NAME."""


def needs_of(folder: Path, rel: str) -> Needs | None:
    """What the file ``folder/rel`` needs to run: its ELF header's machine and PT_INTERP, or
    its ``#!`` line; None for a file that is neither (data, or a script run by another)."""
    with open(folder / rel, "rb") as f:
        head = f.read(_HEAD)
        if head.startswith(b"#!"):
            line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
            if not line:
                return None
            return Needs(
                rel, None, line[0], _env_command(line) if line[0].endswith("/env") else None
            )
        if not head.startswith(b"\x7fELF") or len(head) < 64:
            return None
        return _elf(rel, f, head)


def _env_command(words: Sequence[str]) -> str | None:
    """The command ``#!/usr/bin/env [-S] [-i] [NAME=VALUE ...] COMMAND ...`` runs: the first
    word after env's options and assignments (``-S`` splits the rest into words, as here)."""
    for word in words[1:]:
        if word.startswith("-") or "=" in word:
            continue
        return word
    return None


def _elf(rel: str, f: Any, head: bytes) -> Needs:
    wide = head[4] == 2
    e = "<" if head[5] == 1 else ">"
    (machine,) = struct.unpack_from(e + "H", head, 18)
    if wide:
        (phoff,) = struct.unpack_from(e + "Q", head, 32)
        phentsize, phnum = struct.unpack_from(e + "HH", head, 54)
    else:
        (phoff,) = struct.unpack_from(e + "I", head, 28)
        phentsize, phnum = struct.unpack_from(e + "HH", head, 42)
    arch = _ELF_MACHINES.get(machine, f"elf-machine-{machine}")
    if phentsize < (56 if wide else 32) or phnum > 512:
        return Needs(rel, arch)
    try:
        return _interp(rel, f, arch, e, wide, phoff, phentsize, phnum)
    except (OSError, ValueError, OverflowError):  # an offset past what a file can hold
        return Needs(rel, arch)  # as a table that cannot be read above: no loader named


def _interp(
    rel: str, f: Any, arch: str, e: str, wide: bool, phoff: int, phentsize: int, phnum: int
) -> Needs:
    f.seek(phoff)
    table = f.read(phentsize * phnum)
    for i in range(len(table) // phentsize):
        ph = table[i * phentsize : (i + 1) * phentsize]
        (p_type,) = struct.unpack_from(e + "I", ph, 0)
        if p_type != 3:  # PT_INTERP
            continue
        if wide:
            (offset,) = struct.unpack_from(e + "Q", ph, 8)
            (size,) = struct.unpack_from(e + "Q", ph, 32)
        else:
            (offset,) = struct.unpack_from(e + "I", ph, 4)
            (size,) = struct.unpack_from(e + "I", ph, 16)
        f.seek(offset)
        interp = f.read(min(size, 4096)).split(b"\0", 1)[0].decode("utf-8", "replace")
        return Needs(rel, arch, interp or None)
    return Needs(rel, arch)  # static: needs no loader


class _Unresolvable(Exception):
    """The engine cannot resolve a path of the image: a folder on the way is a file, or its
    links loop (the engine answers 500, not 404: the image's author can make it so)."""


def _stat(files: ImageFiles, path: str) -> PathStat | None:
    """``files.stat(path)``; :class:`_Unresolvable` when the engine fails for that path but
    answers for the image's root (an engine that fails there too is the host's error)."""
    try:
        return files.stat(path)
    except InfrastructureError:
        files.stat("/")
        raise _Unresolvable(path) from None


def _resolved(files: ImageFiles, path: str) -> PathStat | None:
    """``path`` in the image with its links followed; None when nothing is at the end."""
    for _ in range(_LINK_HOPS):
        st = _stat(files, path)
        if st is None or not st.is_link:
            return st
        if not st.link_target or st.link_target == path:
            return None
        path = st.link_target
    return None


def _found(files: ImageFiles, command: str, search: Sequence[str]) -> str | None:
    """Where ``command`` (an absolute path, or a name looked up on ``search``) is an
    executable file in the image; None when nowhere."""
    candidates = [command] if command.startswith("/") else [f"{d}/{command}" for d in search]
    for candidate in candidates:
        try:
            st = _resolved(files, candidate)
        except _Unresolvable:
            continue  # not a command there (PATH=/etc/passwd:/usr/bin, say)
        if st is not None and st.is_regular and st.executable:
            return candidate
    return None


MAX_SEARCH = 128
"""The most PATH entries a command is looked up in (each is an engine call, and only a
command not found yet looks further; a longer PATH's tail is not searched, and says so)."""


def image_path(info: ImageInfo) -> str:
    """The PATH the image's configuration gives its processes (the engine's default if none)."""
    return info.env_value("PATH") or DEFAULT_PATH


def search_path(path: str) -> list[str]:
    """Where a command is looked up on ``path`` for the fit check: its absolute entries, each
    once, at most :data:`MAX_SEARCH` (each is an engine call; a relative entry depends on
    the working folder the runtime chdirs to, and is not checked)."""
    return list(dict.fromkeys(d for d in path.split(":") if d.startswith("/")))[:MAX_SEARCH]


GLIBC_LOADERS = ("ld-linux", "ld64.so")
"""Names of glibc's dynamic loaders (ld-linux-x86-64.so.2, ld-linux-aarch64.so.1, ld64.so.2)."""
LIBC_DIRS = ("/usr/lib", "/lib", "/usr/lib64", "/lib64")
"""Where glibc's libc.so.6 is found (also in each one's <arch triplet> folder)."""


def _has_glibc(files: ImageFiles, triplets: Sequence[str]) -> bool:
    """Whether the image has glibc's libc.so.6 (a glibc loader alone can be a musl shim)."""
    for d in LIBC_DIRS:
        for sub in (*triplets, ""):
            try:
                st = _resolved(files, f"{d}/{sub}/libc.so.6" if sub else f"{d}/libc.so.6")
            except _Unresolvable:
                continue
            if st is not None and st.is_regular:
                return True
    return False


_TRIPLETS = {
    "amd64": ("x86_64-linux-gnu",),
    "arm64": ("aarch64-linux-gnu",),
    "ppc64le": ("powerpc64le-linux-gnu",),
    "s390x": ("s390x-linux-gnu",),
    "386": ("i386-linux-gnu",),
    "arm": ("arm-linux-gnueabihf",),
    "riscv64": ("riscv64-linux-gnu",),
}


def host_arch() -> str:
    """The architecture the engine runs an image on when the image names none."""
    return normalize_arch(os.uname().machine)


def check_fits(
    backend: Backend,
    contract_image: ImageInfo,
    reference: str,
    runtime: Runtime,
    argv: Sequence[str],
    requires: Sequence[str],
    labels: Mapping[str, str],
    path: str | None = None,
) -> None:
    """Refuse (PolicyViolation, naming why and the image) a runtime that cannot run in the
    contract's image, with ``path`` the PATH the runtime is started with (None: the image's);
    nothing of either image runs."""
    arch = normalize_arch(contract_image.architecture or "") or host_arch()
    what = f"the contract's image {reference} ({contract_image.id})"
    hint = (
        "run the contract with an image that has what the runtime needs (glibc's loader, "
        "/bin/sh, the commands its adapter names), or give the host policy's adapter "
        '"runIn": "adapter-image" to run the agent in the runtime\'s own image'
    )
    needs = [n for f in runtime.files if f.executable and (n := needs_of(runtime.folder, f.path))]
    for n in needs:
        if n.machine is not None and n.machine != arch:
            raise PolicyViolation(
                f"the agent runtime cannot run in {what}: its {n.path} is built for "
                f"{n.machine}, the image for {arch}",
                hint=hint,
            )
    search = search_path(path if path is not None else image_path(contract_image))
    # The runtime's own folder is not the image's: a command there is one of its files.
    own = {f.path for f in runtime.files if f.executable and "/" not in f.path}
    if MOUNT in search:
        requires = [c for c in requires if c not in own]
    search = [d for d in search if d != MOUNT]
    with backend.image_files(contract_image.id, dict(labels)) as files:
        missing: list[str] = []
        for n in needs:
            if n.interpreter is None:
                continue
            if n.interpreter.startswith(MOUNT + "/"):
                continue
            if _found(files, n.interpreter, search) is None:
                why = "dynamic loader" if n.machine is not None else "interpreter"
                missing.append(f"{n.path}'s {why} {n.interpreter}")
            elif (
                n.machine is not None
                and n.interpreter.rsplit("/", 1)[-1].startswith(GLIBC_LOADERS)
                and not _has_glibc(files, _TRIPLETS.get(n.machine, ()))
            ):
                missing.append(f"glibc (libc.so.6) for {n.path}, whose loader is glibc's "
                               f"{n.interpreter} (a musl image's shim is not glibc)")  # fmt: skip
            elif n.interpreter_arg and _found(files, n.interpreter_arg, search) is None:
                missing.append(f"{n.path}'s interpreter {n.interpreter_arg}")
        for folder in ("/opt", MOUNT):  # the mount point: a real folder, or nothing yet
            try:
                st = _stat(files, folder)  # a link is not followed: it could lead into /job
            except _Unresolvable:
                st = PathStat(folder, 0, 0, "")  # a link that loops: not a folder either
            if st is not None and (st.is_link or not st.is_dir):
                missing.append(f"folder at {folder} (something else is there) to mount the "
                               f"runtime at {MOUNT}")  # fmt: skip
        first = argv[0] if argv else ""
        mine = first.startswith(MOUNT + "/") or (first in own and MOUNT in search_path(path or ""))
        wanted = ["/bin/sh", *([first] if first and not mine else [])]
        for command in [*wanted, *requires]:
            if _found(files, command, search) is None:
                where = (
                    ""
                    if command.startswith("/")
                    else f" (on its PATH {':'.join(search)}"
                    + (f", its first {MAX_SEARCH} entries)" if len(search) == MAX_SEARCH else ")")
                )
                missing.append(f"{command}{where}")
    if missing:
        raise PolicyViolation(
            f"the agent runtime cannot run in {what}: the image has no "
            + "; no ".join(dict.fromkeys(missing)),
            hint=hint,
        )
