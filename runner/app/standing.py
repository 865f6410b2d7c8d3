"""Whether the client at the other end of the server's socket may do what the server may.

A fork of ``runner serve`` runs its client's command with the server's credentials: its ids
and groups, its capabilities, its seccomp filters and LSM label, its namespaces. Were the
client's fewer (a shell started before its user joined the engine's group, a root shell with
capabilities dropped, a process in a mount namespace where the engine's socket is out of
sight, a sandbox's seccomp filter), the server would lend it the difference. So the server
compares the two, and a client that differs runs its command itself.

What is compared: the lines of ``/proc/<pid>/status`` that say what a process may do beyond
its uid (uids and gids, real, effective, saved and file system; groups; capabilities;
no-new-privileges; seccomp's mode and filter count), its LSM label (``attr/current``) and its
namespaces (all but time's). What is not, as Linux shows it nowhere: Landlock domains,
resource limits, and which seccomp filters (only how many). And within one uid, groups are no
boundary where the uid's processes may ptrace each other (no Yama): this check keeps a served
command to its client's own rights; it does not make a boundary the host has not.

The client's pid is read through a pidfd of the peer (``SO_PEERPIDFD``, Linux 6.5+), checked
alive after ``/proc`` is read, so that no process that took its pid meanwhile is read in its
place. Before 6.5 there is none: there the ids and groups read from ``/proc`` must also be
those the kernel recorded for the connection itself (``SO_PEERCRED``, ``SO_PEERGROUPS``), so
that only a process with the client's own ids and groups could stand in for it.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct

__all__ = ["same_standing", "standing"]

_STATUS = (
    "Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs",
    "Seccomp", "Seccomp_filters",
)  # fmt: skip
"""The lines of ``/proc/<pid>/status`` compared (one a kernel does not write reads as absent
on both sides)."""

_NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "user", "uts")

_STATUS_MAX = 1 << 20
"""``/proc/<pid>/status`` with 65,536 groups of ten digits is about 720 kB."""

_SO_PEERPIDFD = 77
_SO_PEERGROUPS = 59
"""Linux's socket options for a pidfd of the peer (6.5+) and its groups (4.13+); not in
``socket``."""


def standing(pid: int | str = "self") -> dict[str, str] | None:
    """What process ``pid`` may do beyond being its uid (see the module), read from ``/proc``;
    None when it cannot be read whole (the process gone, out of this process's view, or a
    line twice)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            text = status.read(_STATUS_MAX + 1)
        if len(text) > _STATUS_MAX:
            return None
        found: dict[str, str] = {}
        for line in text.split("\n"):  # the kernel escapes a newline in a name, and only that
            key, _, value = line.partition(":")
            if key in _STATUS:
                if key in found:
                    return None
                found[key] = " ".join(value.split())
        gids = found["Gid"].split()
        found["Groups"] = " ".join(sorted({*found.get("Groups", "").split(), gids[1]}, key=int))
        for name in _NAMESPACES:
            found[f"ns {name}"] = os.readlink(f"/proc/{pid}/ns/{name}")
        try:
            with open(f"/proc/{pid}/attr/current", "rb") as label:
                found["label"] = label.read(4096).decode("ascii", "replace")
        except OSError:  # no LSM that labels processes
            found["label"] = "-"
    except (OSError, KeyError, IndexError, ValueError):
        return None
    return found


def _credentials(conn: socket.socket) -> tuple[int, int, int]:
    """The peer's pid, effective uid and effective gid, as the kernel recorded them when it
    connected (``SO_PEERCRED``; the client's lighter reading is runner.app.host.peer)."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
    pid, uid, gid = struct.unpack("iII", raw)  # uid_t and gid_t are unsigned
    return pid, uid, gid


def _recorded(conn: socket.socket) -> tuple[str, str] | None:
    """The effective uid and the groups (the effective gid among them) the kernel recorded for
    the connection (``SO_PEERCRED``, ``SO_PEERGROUPS``): "uid" and "groups" as
    :func:`standing` writes them; None past 256 groups (Python reads 1024 bytes of an
    option)."""
    _pid, uid, gid = _credentials(conn)
    try:
        listed = conn.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, 1024)
    except OSError:
        return None
    groups = {*struct.unpack(f"{len(listed) // 4}I", listed), gid}
    return str(uid), " ".join(str(g) for g in sorted(groups))


def same_standing(conn: socket.socket) -> bool:
    """Whether the process at the other end of the Unix socket ``conn`` may do all and only
    what this process may (see the module); False whenever either cannot be read."""
    ours = standing()
    if ours is None:
        return False
    pid, _uid, _gid = _credentials(conn)
    if pid <= 0:  # not in this process's view
        return False
    try:
        pidfd: int | None = conn.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD)
    except OSError as exc:
        if exc.errno != errno.ENOPROTOOPT:  # the peer is gone already
            return False
        pidfd = None  # a kernel before 6.5
    try:
        theirs = standing(pid)
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, 0)  # still the process that connected
        elif theirs is not None:
            recorded = _recorded(conn)
            if recorded is None or recorded != (theirs["Uid"].split()[1], theirs["Groups"]):
                return False
    except OSError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return theirs == ours
