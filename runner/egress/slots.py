"""The egress allowlist: a job that reaches named ``host:port`` pairs through a proxy, and
nothing else.

Long on purpose: a slot's whole life (lease, make, free, reap) is one set of rules about one
lock and the engine's view of the slot; split, each half would have to restate them.

The network a job needs is leased, not built, per attempt: building it (an internal network,
a proxy, a namespace holder) takes the engine about a second, and tearing it down half as
long again, on every attempt. So each state folder keeps a small pool of *slots*, made on
first need and reused, one attempt at a time:

    <slot>-net    an internal bridge network: the engine forwards nothing out of it, and this
                  host has no address on it
    <slot>-proxy  the runner's proxy (runner-proxy image) on <slot>-net, reached as
                  ``egress-proxy``, and on the policy's upstream network: the only way out
    <slot>-netns  the job's network namespace: on <slot>-net with every route cut but the one
                  to <slot>-net, and the host's bridge address unreachable

:func:`lease` takes a free slot (a lock file per slot under ``<state>/egress/``, held by the
runner while the attempt runs, and no container of an earlier attempt still in it), makes one
when none is free, and writes the attempt's rules (``<state>/egress/<slot>/rules.json``,
mounted read-only into the proxy, read by it at each request). :func:`down` refuses
everything again, keeps the attempt's lines of the proxy's log in its record and frees the
slot. A slot idle for :data:`IDLE_SECONDS` is removed by the next runner of the state folder
that ends an attempt, and ``runner cleanup`` removes every free slot of its state folder at
once (:data:`STATE`).

The job's container joins ``container:<slot>-netns``. Docker 20.10 gives a container on an
internal network a default route through the host's bridge address, and its embedded DNS
forwards names it does not know to the host's resolvers (from the host itself when those are
on loopback): the holder removes the route, and its resolver is ``127.0.0.1`` in that
namespace, where nothing listens, so no name outside the job's network resolves (a lookup
fails within a second: ``timeout:1 attempts:1``). Routes alone do not keep a job from the
host: ``SO_DONTROUTE`` and a broadcast need none, and the host answered on its bridge address
to every service it runs on all addresses. So the network gives the host no address at all
(``com.docker.network.bridge.inhibit_ipv4``), and the holder's packet filter lets out of the
namespace only loopback (the engine's DNS) and TCP to port 3128 on the slot's network (the
proxy): without it a limited broadcast still reached the host, one way
(images/proxy/egress-netns). The proxy refuses by default and lets
through only the allowed pairs, matched whole on what the job asked for: ``CONNECT
host:port`` (a TLS tunnel) and ``http://host:port/...`` (plain HTTP, forwarded). An IP
literal, another port, another host, a user-info trick (``http://a:1@b/``) never match, and a
refused name is never resolved; a redirect to another host is a new request, refused the
same way. A namespace that served one attempt serves the next: the job's processes end with
its container, and without NET_ADMIN it changed nothing in the namespace.

The proxy logs every request as JSON lines naming the lease (the attempt) it was served
under; :mod:`runner.egress.proxylog` turns an attempt's lines into connections, each allowed,
refused or incomplete. An agent's attempt's rules carry salted digests of its secrets
(:meth:`runner.core.redaction.Redactor.proxy_rules`): the proxy logs a field holding one as
``[redacted: NAME]``, so the engine's log of a slot, which outlives the attempt, never holds
a secret; :func:`down` redacts the kept lines again with the values themselves.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.backends.base import Backend, ContainerSpec, ContainerSummary, Mount, NetworkInfo
from runner.backends.types import MIB, EgressPlan, HostPort, Limits
from runner.core import locks
from runner.core.errors import ContainerVanished, ImageUnavailable, InfrastructureError, RunnerError
from runner.core.redaction import NONE, Redactor
from runner.egress.local import host_addresses
from runner.egress.proxylog import Tally, read_log, read_tally
from runner.models.envelope import EgressRecord

__all__ = [
    "HOLDER_LIMITS",
    "LOCK",
    "POOL",
    "PROXY_UID_BASE",
    "PROXY_UID_GROUPS",
    "ROLE",
    "SLOT",
    "STATE",
    "TALLY_SECONDS",
    "Egress",
    "down",
    "lease",
    "pool_dir",
    "proxy_rules",
    "proxy_user",
    "reap",
    "release",
]

ROLE = "org.runner.role"
"""Label naming what an egress resource is: egress-network, egress-proxy, egress-netns."""
POOL = "org.runner.egress-pool"
"""Label on a slot's resources, and on the job containers in it: the pool's id."""
SLOT = "org.runner.egress-slot"
"""Label on a slot's resources, and on the job container in it: the slot's name."""
LOCK = "org.runner.egress-lock"
"""Label on a slot's resources: its lock file (``runner cleanup`` frees only what is free)."""
STATE = "org.runner.state-dir"
"""Label on a slot's resources: the state folder whose pool it is (resolved), which
``runner cleanup --state-dir`` looks for. A slot made before this label is left alone by
``runner cleanup``; its own state folder's runners still reap it when idle (:func:`down`)."""
LOG_MAX_BYTES = 16 * MIB
"""An attempt's lines of the proxy's log kept in its record (the proxy's own bytes; the
engine's timestamps besides): some 50,000 requests, and more than the proxy logs of one
lease (15 MiB, then its ``log-capped`` and ``tally`` lines)."""
PROXY_LOG_BYTES = 64 * MIB
"""The engine's log of a slot's proxy, two files of it (it serves many attempts, one at a time,
and logs at most 15 MiB of each: an attempt's lines always fit in the newest file)."""
MAX_CONNECTIONS = 1000
"""Connections listed in the envelope; all are counted."""
READY_SECONDS = 60.0
IDLE_SECONDS = 600.0
"""A slot unused this long is removed when an attempt of its pool ends."""
MAX_SLOTS = 256
"""Slots in one pool: attempts with egress running at once in one state folder."""
_READY = {"proxy": b"egress-proxy: accepting connections", "netns": b"egress-netns: ready"}
RULES = "rules.json"
_CLOCK_SLACK = 1.0
"""The engine's log times and the runner's clock are one host's; a second of slack."""
TALLY_SECONDS = 3.0
"""How long :func:`down` waits for a capped lease's tally: the proxy writes it when its
watcher (every half second) sees the lease end."""

PROXY_UID_BASE = 0x70000000
"""A slot's proxy runs as a uid of its own (:func:`proxy_user`): PROXY_UID_BASE
(1,879,048,192), plus 256 for each of :data:`PROXY_UID_GROUPS` pool groups (by the pool's
id), plus the slot's number less one. That is the range systemd leaves unused (its
UIDS-GIDS.md: above the container ranges of systemd-nspawn, below its foreign range and the
ids some tools read as negative): no job (a job runs as its caller's uid or 10001) and no
account a host makes itself has it (a directory's id mapping, as SSSD's for Active Directory,
may place accounts anywhere up to 2,000,200,000: one of a pool's 256 is unlikely, not
impossible). The kernel counts the pages of a user's pipes against one budget per uid
(``pipe-user-pages-soft``, 64 MiB), and each relay direction makes a 1 MiB pipe: under one
shared uid, a job holding idle tunnels cut another slot's downloads to a quarter once new
pipes fell back to 8 KiB. Slots of one pool never share a uid; two pools share theirs one
time in about a million. An engine that maps uids into a user namespace (``userns-remap``,
rootless Docker) does not map these: the runner's egress needs a rootful Docker."""
PROXY_UID_GROUPS = (0x7FFE0000 - PROXY_UID_BASE) // 256
_BOX: dict[str, Any] = {"gpus": "none", "network": "none", "timeout_seconds": 1.0}
PROXY_LIMITS = Limits(
    cpus=2.0, memory_bytes=256 * MIB, memory_swap_bytes=256 * MIB, shm_bytes=MIB, pids=256,
    tmpfs_bytes=MIB, **_BOX,
)  # fmt: skip
"""The proxy runs two threads per connection (at most 100 connections at once); a tunnel at
full speed keeps about a core busy with the kernel's copies."""
HOLDER_LIMITS = Limits(
    cpus=0.1, memory_bytes=16 * MIB, memory_swap_bytes=16 * MIB, shm_bytes=MIB, pids=16,
    tmpfs_bytes=MIB, cap_add=("NET_ADMIN",), **_BOX,
)  # fmt: skip
"""The holder runs as root with NET_ADMIN alone: it cuts the routes, then sleeps."""

_held: dict[str, int] = {}
"""The slot locks this process holds (slot -> open lock file), released by :func:`down`: an
operating-system resource of this process, like its open files."""
_held_lock = threading.Lock()


@dataclass(frozen=True)
class Egress:
    """One attempt's egress, as leased (and as the ledger records it, :meth:`as_json`)."""

    slot: str
    lease: str
    """The attempt's name in the proxy's rules and log lines."""
    allow: tuple[HostPort, ...]
    upstream_network: str
    proxy_image: str
    """The proxy image's id."""
    pool: str
    rules: str
    """The rules file the proxy reads."""
    since: float
    """When it was leased (seconds since the epoch): its log lines are later."""
    private_networks: tuple[str, ...] = ()
    """The non-public ranges an allowed name may resolve to (the policy's)."""

    @property
    def network(self) -> str:
        return f"{self.slot}-net"

    @property
    def proxy(self) -> str:
        return f"{self.slot}-proxy"

    @property
    def holder(self) -> str:
        return f"{self.slot}-netns"

    @property
    def network_mode(self) -> str:
        """How the job's container joins it."""
        return f"container:{self.holder}"

    def job_labels(self) -> dict[str, str]:
        """Labels of the job's container: the slot is busy while it exists."""
        return {POOL: self.pool, SLOT: self.slot}

    def as_json(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "lease": self.lease,
            "network": self.network,
            "proxy": self.proxy,
            "holder": self.holder,
            "allow": [str(x) for x in self.allow],
            "upstreamNetwork": self.upstream_network,
            "proxyImage": self.proxy_image,
            "pool": self.pool,
            "rules": self.rules,
            "since": self.since,
            "privateNetworks": list(self.private_networks),
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> Egress:
        return Egress(
            slot=str(data["slot"]),
            lease=str(data["lease"]),
            allow=tuple(HostPort.parse(x) for x in data["allow"]),
            upstream_network=str(data["upstreamNetwork"]),
            proxy_image=str(data["proxyImage"]),
            pool=str(data["pool"]),
            rules=str(data["rules"]),
            since=float(data["since"]),
            private_networks=tuple(str(x) for x in data.get("privateNetworks", ())),
        )


def proxy_rules(
    allow: tuple[HostPort, ...],
    lease: str | None,
    redactor: Redactor = NONE,
    networks: tuple[str, ...] = (),
    refuse: tuple[str, ...] = (),
) -> str:
    """The proxy's rules for ``allow`` (JSON): the pairs it lets through, compared whole on
    what the job asked for; everything else is refused. ``networks``: the non-public ranges
    an allowed name may resolve to (any other non-public address is refused); ``refuse``:
    ranges it may never lead to, ``networks`` or not (this host's own:
    :func:`runner.egress.local.host_addresses`). With an attempt's secrets, the salted
    digests the proxy blanks its log lines with (:meth:`Redactor.proxy_rules`)."""
    rules: dict[str, Any] = {"lease": lease, "allow": [str(x) for x in allow]}
    if networks:
        rules["networks"] = list(networks)
    if refuse:
        rules["refuse"] = list(refuse)
    if (redact := redactor.proxy_rules()) is not None:
        rules["redact"] = redact
    return json.dumps(rules, sort_keys=True)


def pool_dir(state_dir: Path) -> Path:
    return state_dir / "egress"


_LAYOUT = "3"
"""How a slot is made; a slot of another layout is another pool's, never leased again and
reaped once idle. 2: its network gives this host no address, and its holder filters what
leaves the namespace (before, a job reached the host's services on it with SO_DONTROUTE or a
broadcast). 3: its proxy runs as the slot's own uid (:func:`proxy_user`), and checks the
addresses an allowed name resolves to."""


def proxy_user(pool: str, slot: str) -> str:
    """``uid:gid`` the proxy of ``slot`` (of ``pool``) runs as: its own (see
    :data:`PROXY_UID_BASE`)."""
    found = _SLOT_NAME.fullmatch(slot)
    number = int(found.group(2)) if found else 0
    if not 1 <= number <= MAX_SLOTS:
        raise ValueError(f"{slot!r} is no slot of a pool (its number is 1 to {MAX_SLOTS})")
    uid = PROXY_UID_BASE + (int(pool, 16) % PROXY_UID_GROUPS) * 256 + number - 1
    return f"{uid}:{uid}"


def _pool_id(state_dir: Path, upstream: str, image_id: str) -> str:
    key = f"{state_dir.resolve()}\0{upstream}\0{image_id}\0{_LAYOUT}".encode()
    return hashlib.sha256(key).hexdigest()[:12]


def lease(
    backend: Backend,
    plan: EgressPlan,
    attempt_name: str,
    state_dir: Path,
    *,
    labels: dict[str, str] | None = None,
    ready_seconds: float = READY_SECONDS,
    redactor: Redactor = NONE,
) -> Egress:
    """A slot of the state folder's pool for the attempt named ``attempt_name``, its rules
    written: a free one, else a new one (made and ready before this returns, carrying
    ``labels`` too: the run's own). The slot's lock is held by this process until
    :func:`down`. ``redactor``: the attempt's secrets, which the proxy never logs."""
    info = backend.inspect_image(plan.proxy_image)
    if info is None:
        raise ImageUnavailable(
            f"the egress proxy's image {plan.proxy_image} is not on this host",
            hint="build it (scripts/setup.sh builds runner-proxy:local), or name another in "
            "the host policy's egress.proxyImage",
        )
    pool = _pool_id(state_dir, plan.upstream_network, info.id)
    folder = pool_dir(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    found = backend.find({POOL: pool})
    slots = _slots(found)
    busy = {c.labels.get(SLOT) for c in found if c.labels.get(ROLE) is None}
    names = [f"runner-egress-{pool}-{k:03d}" for k in range(1, MAX_SLOTS + 1)]
    for slot in sorted(slots) + [n for n in names if n not in slots]:
        if slot in busy:
            continue
        handle = _try_lock(folder / f"{slot}.lock")
        if handle is None:
            continue
        if _in_use(backend, pool, slot):  # a job container made since the listing
            locks.release(handle)
            continue
        try:
            eg = Egress(
                slot=slot,
                lease=f"{attempt_name}.{secrets.token_hex(4)}",
                allow=plan.allow,
                upstream_network=plan.upstream_network,
                proxy_image=info.id,
                pool=pool,
                rules=str(folder / slot / RULES),
                since=time.time(),
                private_networks=plan.private_networks,
            )
            if not _healthy(backend, eg, slots.get(slot, [])):
                _make(backend, eg, folder, labels or {}, ready_seconds)
            own = host_addresses(eg.private_networks)  # read now: a host's addresses change
            rules = proxy_rules(eg.allow, eg.lease, redactor, eg.private_networks, own)
            _write_rules(Path(eg.rules), rules)
        except BaseException:
            locks.release(handle)
            raise
        with _held_lock:
            _held[slot] = handle
        return eg
    raise InfrastructureError(
        f"all {MAX_SLOTS} egress slots of this state folder are in use",
        hint="wait for some jobs to end, or run `runner cleanup`",
    )


_SLOT_NAME = re.compile(r"runner-egress-([0-9a-f]{12})-([0-9]{3})", re.ASCII)


def _numbered(named: re.Match[str]) -> bool:
    return 1 <= int(named.group(2)) <= MAX_SLOTS


def _slots(found: list[ContainerSummary]) -> dict[str, list[ContainerSummary]]:
    """The pool's slots as the engine lists them: slot name -> its proxy and holder (a
    label that is no slot's name, as :func:`lease` makes them, is no slot)."""
    slots: dict[str, list[ContainerSummary]] = {}
    for c in found:
        role, slot = c.labels.get(ROLE), c.labels.get(SLOT, "")
        named = _SLOT_NAME.fullmatch(slot)
        if role in ("egress-proxy", "egress-netns") and named and _numbered(named):
            slots.setdefault(c.labels[SLOT], []).append(c)
    return slots


def _in_use(backend: Backend, pool: str, slot: str) -> bool:
    """Whether a job container is in the slot (looked up now, the slot's lock held)."""
    return any(c.labels.get(ROLE) is None for c in backend.find({POOL: pool, SLOT: slot}))


def _healthy(backend: Backend, eg: Egress, listed: list[ContainerSummary]) -> bool:
    """Whether the slot's proxy and holder run, as listed and still now (the lock is ours:
    nothing but ``runner cleanup`` of a moment ago can have removed them since)."""
    if len(listed) != 2 or any(c.status != "running" for c in listed):
        return False
    try:
        return all(backend.state(name).running for name in (eg.proxy, eg.holder))
    except RunnerError:
        return False


def _try_lock(path: Path) -> int | None:
    """The slot's lock, held (an open descriptor) until :func:`locks.release`; None: taken."""
    return locks.try_lock(path, opener=_open_slot_lock)


def _open_slot_lock(path: Path) -> int:
    return locks.open_lock_file(path, mode=0o644, follow_links=False)


def _write_rules(path: Path, text: str) -> None:
    """Replace the rules at once (the proxy reads a whole file, old or new, never half)."""
    tmp = path.with_name(f".{RULES}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(text + "\n")
    tmp.chmod(0o644)
    os.replace(tmp, path)


def _labels(eg: Egress, folder: Path, role: str, extra: dict[str, str]) -> dict[str, str]:
    lock = str(folder / f"{eg.slot}.lock")
    state = str(folder.parent.resolve())  # folder is pool_dir(state_dir)
    return {**extra, POOL: eg.pool, SLOT: eg.slot, LOCK: lock, STATE: state, ROLE: role}


def _make(
    backend: Backend, eg: Egress, folder: Path, labels: dict[str, str], ready_seconds: float
) -> None:
    """Make the slot (what is left of it under its names goes first), and wait until both
    containers say they are ready. On any failure what was made is removed again."""
    rules_dir = folder / eg.slot
    rules_dir.mkdir(mode=0o755, exist_ok=True)
    rules_dir.chmod(0o755)
    _write_rules(rules_dir / RULES, proxy_rules((), None))
    _remove_all(backend, eg)
    try:
        net = _network(backend, eg, _labels(eg, folder, "egress-network", labels))
        proxy, holder = _specs(eg, net, folder, labels)
        ids = {"proxy": backend.create(proxy), "netns": backend.create(holder)}
        _together([lambda: backend.start(ids["proxy"]), lambda: backend.start(ids["netns"])])
        _wait_ready(backend, ids, rules_dir, ready_seconds)
    except BaseException:
        _remove_all(backend, eg)
        raise


def _network(backend: Backend, eg: Egress, labels: dict[str, str]) -> NetworkInfo:
    """The slot's network. The engine has a few dozen address pools (Docker's defaults: 31);
    when they are all taken, the free slots of every state folder (a cache: no runner holds
    them, no job is in them) are removed, and the network asked for once more."""
    try:
        return backend.create_network(eg.network, labels, internal=True)
    except InfrastructureError as exc:
        if "address pool" not in str(exc) or not reap(backend, idle_seconds=0.0):
            raise
    return backend.create_network(eg.network, labels, internal=True)


def _specs(
    eg: Egress, net: NetworkInfo, folder: Path, labels: dict[str, str]
) -> tuple[ContainerSpec, ContainerSpec]:
    common: dict[str, Any] = {
        "image": eg.proxy_image,
        "command": [],
        "working_dir": "/",
        "network": eg.network,
    }
    proxy = ContainerSpec(
        name=eg.proxy,
        entrypoint=["/usr/local/bin/egress-proxy"],
        user=proxy_user(eg.pool, eg.slot),
        environment={
            "EGRESS_RULES_FILE": f"/egress/{RULES}",
            "EGRESS_CLIENTS": net.subnet,
            "NVIDIA_VISIBLE_DEVICES": "void",
        },
        labels=_labels(eg, folder, "egress-proxy", labels),
        mounts=[Mount(folder / eg.slot, "/egress", read_only=True)],
        limits=PROXY_LIMITS,
        log_max_bytes=PROXY_LOG_BYTES,
        log_files=2,
        aliases=(EgressPlan.PROXY_ALIAS,),
        extra_networks=(eg.upstream_network,),
        **common,
    )
    holder = ContainerSpec(
        name=eg.holder,
        entrypoint=["/usr/local/bin/egress-netns"],
        user="0:0",
        environment={
            "EGRESS_SUBNET": net.subnet,
            "EGRESS_GATEWAY": net.gateway,
            "NVIDIA_VISIBLE_DEVICES": "void",
        },
        labels=_labels(eg, folder, "egress-netns", labels),
        mounts=[],
        limits=HOLDER_LIMITS,
        dns=("127.0.0.1",),
        # The embedded DNS answers nothing when its resolver does not: fail in a second, not ten.
        dns_options=("timeout:1", "attempts:1"),
        **common,
    )
    return proxy, holder


def _together(calls: list[Callable[[], None]]) -> None:
    """Run the calls at once (the engine starts containers in parallel); the first error."""
    errors: list[BaseException] = []

    def run(call: Callable[[], None]) -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in calls[1:]]
    for t in threads:
        t.start()
    run(calls[0])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _wait_ready(backend: Backend, ids: dict[str, str], record_dir: Path, seconds: float) -> None:
    """Poll both containers' logs for their ready line; fail when one ends or time runs out."""
    waiting = dict(ids)
    deadline = time.monotonic() + seconds
    polls = 0
    while waiting:
        for role, cid in list(waiting.items()):
            log = record_dir / f".{role}.start.log"
            backend.save_logs(cid, log, 64 * 1024)
            if _READY[role] in log.read_bytes():
                log.unlink()
                del waiting[role]
            elif polls % 20 == 19 and not backend.state(cid).running:
                tail = log.read_text(errors="replace")[-600:].strip()
                raise InfrastructureError(
                    f"the egress {role} container ended as it started: {tail or 'no log'}",
                    hint="check the runner-proxy image (scripts/setup.sh rebuilds it) and the "
                    "policy's egress.upstreamNetwork",
                )
        if waiting and time.monotonic() > deadline:
            raise InfrastructureError(
                f"the egress {', '.join(waiting)} did not become ready within {seconds:.0f} s"
            )
        if waiting:
            polls += 1
            time.sleep(0.01)


def _remove_all(backend: Backend, eg: Egress) -> list[str]:
    return _remove_slot(backend, eg.slot)


def down(
    backend: Backend,
    eg: Egress,
    record_dir: Path,
    job_root: Path,
    redactor: Redactor = NONE,
) -> EgressRecord:
    """End the attempt's lease: its slot refuses everything again, the attempt's lines of the
    proxy's log, redacted (``redactor``: the attempt's secrets, in every form it knows), are
    kept as ``egress.log`` in its record (at most :data:`LOG_MAX_BYTES`) and
    read into its egress record, also written as ``egress.json``, and the slot is free for the
    next attempt. Safe to call again, and from another process than the one that leased it (a
    rerun after a crash): it returns the record the first call wrote. Never raises the
    engine's errors, which it lists in ``problems``."""
    record_dir.mkdir(parents=True, exist_ok=True)
    log, kept = record_dir / "egress.log", record_dir / "egress.json"
    problems: list[str] = []
    denied = time.time()
    _deny(eg)
    if kept.exists():
        with contextlib.suppress(OSError, ValueError):
            before = EgressRecord.model_validate_json(kept.read_bytes())
            _release(eg)
            return before
    raw = record_dir / ".egress.engine.log"
    saved: int | None = None
    try:
        saved = backend.save_logs(eg.proxy, raw, 4 * LOG_MAX_BYTES, since=eg.since - _CLOCK_SLACK)
    except ContainerVanished:
        problems.append("the proxy was gone: its log is lost")
    except RunnerError as exc:
        problems.append(f"the proxy's log could not be read: {exc}")
    mine, cut = _mine(raw, eg.lease) if saved is not None else ("", False)
    text = redactor.text(mine)
    raw.unlink(missing_ok=True)
    tally = read_tally(text, eg.lease)  # written already (a rerun's down, a quick watcher)
    if tally is None and (cut or '"event":"log-capped"' in text):
        text, tally = _with_tally(backend, eg, raw, text, denied, redactor)
        if tally is None:
            problems.append(
                "the proxy logged this attempt's requests up to its cap, and its tally of "
                "them all was not found: the counts are of the logged ones only"
            )
    log.write_text(text)
    connections = read_log(text, eg.lease)
    record = EgressRecord(
        allow=[str(x) for x in eg.allow],
        upstreamNetwork=eg.upstream_network,
        privateNetworks=list(eg.private_networks),
        proxyImage=eg.proxy_image,
        network=eg.network,
        allowed=tally.allowed if tally else sum(c.decision == "allowed" for c in connections),
        refused=tally.refused if tally else sum(c.decision == "refused" for c in connections),
        incomplete=(
            tally.incomplete if tally else sum(c.decision == "incomplete" for c in connections)
        ),
        connections=connections[:MAX_CONNECTIONS],
        connectionsDropped=max(len(connections) - MAX_CONNECTIONS, 0),
        log=str(log.relative_to(job_root)),
        logTruncated=cut or _truncated(text, saved),
        problems=problems,
    )
    kept.write_text(record.model_dump_json(indent=2) + "\n")
    _release(eg)
    folder = Path(eg.rules).parent.parent
    with contextlib.suppress(RunnerError, OSError):  # long-idle slots of the state folder's
        if _any_idle(folder):  # pools (an older proxy image's too); asked of the engine only
            reap(backend, folder=folder)  # when a lock file says one may be
    return record


def _with_tally(
    backend: Backend, eg: Egress, raw: Path, text: str, denied: float, redactor: Redactor
) -> tuple[str, Tally | None]:
    """``text`` with the lease's tally line, once the proxy has logged it (it does when its
    watcher sees the lease end, within :data:`TALLY_SECONDS`), and the tally read from it;
    the engine is asked only for what was logged since the lease was denied."""
    deadline = time.monotonic() + TALLY_SECONDS
    while True:
        try:
            backend.save_logs(eg.proxy, raw, LOG_MAX_BYTES, since=denied - _CLOCK_SLACK)
            later = redactor.text(_mine(raw, eg.lease)[0])
        except (RunnerError, OSError):
            later = ""
        finally:
            raw.unlink(missing_ok=True)
        tally = read_tally(later, eg.lease)
        if tally is not None:
            line = next(x for x in later.splitlines(keepends=True) if '"event":"tally"' in x)
            return (text if text.endswith("\n") else text + "\n") + line, tally
        if time.monotonic() > deadline:
            return text, None
        time.sleep(0.1)


def _truncated(text: str, saved: int | None) -> bool:
    """Whether the kept lines may lack some of the lease's: the proxy stopped logging it (at
    15 MiB), the engine's log was read to its cap, or lines of it exist but not its first."""
    if '"event":"log-capped"' in text:
        return True
    return (saved or 0) >= 4 * LOG_MAX_BYTES or (bool(text) and '"event":"lease"' not in text)


def _any_idle(folder: Path) -> bool:
    """Whether some slot of the folder was last used :data:`IDLE_SECONDS` ago or more (its
    lock file's time): a stat per slot, instead of the engine's listings at every attempt."""
    now = time.time()
    return any(now - lock.stat().st_mtime >= IDLE_SECONDS for lock in folder.glob("*.lock"))


def _mine(raw: Path, lease: str) -> tuple[str, bool]:
    """The lines of ``lease`` in the engine's log of the proxy, and whether some were left
    out: at most LOG_MAX_BYTES of the proxy's own lines, the engine's timestamps not counted
    (they add some 31 bytes a line: counted, a flood of short requests filled the window
    before the proxy's cap, and its ``log-capped`` line and tally never made it in)."""
    needle = json.dumps(lease)
    out: list[str] = []
    size = 0
    with raw.open(errors="replace") as f:
        for line in f:
            if needle not in line:
                continue
            size += len(line) - max(line.find("{"), 0)
            if size > LOG_MAX_BYTES:
                return "".join(out), True
            out.append(line)
    return "".join(out), False


def release(eg: Egress) -> None:
    """End a lease that served no container (the attempt never got as far): the slot refuses
    everything again and is free."""
    _deny(eg)
    _release(eg)


def _deny(eg: Egress) -> None:
    """Refuse everything again, unless the slot serves another lease already: done holding
    the slot's lock (this process's, or taken now: a rerun after a crash holds none), so that
    no runner leasing the slot meanwhile has its rules overwritten."""
    with _held_lock:
        mine = eg.slot in _held
    handle = None if mine else _try_lock(Path(eg.rules).parent.parent / f"{eg.slot}.lock")
    if not mine and handle is None:
        return  # another runner holds the slot: it is theirs now
    try:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(Path(eg.rules).read_text()).get("lease") == eg.lease:
                _write_rules(Path(eg.rules), proxy_rules((), None))
    finally:
        if handle is not None:
            locks.release(handle)


def _release(eg: Egress) -> None:
    """Free the slot's lock if this process holds it, and mark when it was last used."""
    with _held_lock:
        handle = _held.pop(eg.slot, None)
    lock = Path(eg.rules).parent.parent / f"{eg.slot}.lock"
    with contextlib.suppress(OSError):
        os.utime(lock)
    if handle is not None:
        locks.release(handle)


def reap(
    backend: Backend,
    *,
    folder: Path | None = None,
    pool: str | None = None,
    idle_seconds: float = IDLE_SECONDS,
    dry_run: bool = False,
    labels: dict[str, str] | None = None,
    state_dir: Path | None = None,
) -> list[str]:
    """Remove the free slots (of ``pool`` and with their locks in ``folder``, when given)
    idle ``idle_seconds`` or longer; the slots removed (with ``dry_run``, that would be). A
    slot is free when no runner holds its lock and no job container is in it. ``labels``:
    only slots carrying these too; ``state_dir``: only the slots of that state folder's
    pools (labelled :data:`STATE` with it, their locks in its ``egress/``)."""
    if state_dir is not None:
        state = state_dir.resolve()
        labels = {**(labels or {}), STATE: str(state)}
        folder = folder or pool_dir(state)
    if pool:
        found = backend.find({POOL: pool})
    else:  # every pool, with each pool's job containers
        pools = {c.labels.get(POOL) for c in backend.find({**(labels or {}), ROLE: "egress-proxy"})}
        found = [c for p in sorted(x for x in pools if x) for c in backend.find({POOL: p})]
    busy = {c.labels.get(SLOT) for c in found if c.labels.get(ROLE) is None}
    gone: list[str] = []
    for slot, mine in sorted(_slots(found).items()):
        lock = Path(mine[0].labels.get(LOCK, "/nonexistent/x.lock"))
        if slot in busy or (folder is not None and lock.parent.resolve() != folder.resolve()):
            continue
        if state_dir is not None and any(c.labels.get(STATE) != str(state) for c in mine):
            continue  # a pool of another state folder, or a slot from before the label
        try:
            if time.time() - lock.stat().st_mtime < idle_seconds:
                continue
            handle = _try_lock(lock)
        except OSError:  # its state folder is gone: nothing can lease it again
            handle = None if lock.parent.exists() else -1
        if handle is None:
            continue
        try:
            if not dry_run:
                _remove_slot(backend, slot)
                (lock.parent / slot / RULES).unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    (lock.parent / slot).rmdir()
            gone.append(slot)
        finally:
            if handle >= 0:
                locks.release(handle)
    return gone


def _remove_slot(backend: Backend, slot: str) -> list[str]:
    """Remove the slot's holder and proxy (at once), then its network; the problems met."""
    problems: list[str] = []

    def remove(name: str) -> Callable[[], None]:
        def call() -> None:
            try:
                backend.remove(name)
            except RunnerError as exc:
                problems.append(str(exc))

        return call

    _together([remove(f"{slot}-netns"), remove(f"{slot}-proxy")])
    try:
        backend.remove_network(f"{slot}-net")
    except RunnerError as exc:
        problems.append(str(exc))
    return problems
