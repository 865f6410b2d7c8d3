"""The egress allowlist: a job that reaches named ``host:port`` pairs through a proxy, and
nothing else. A stage whose lifetime is one attempt's: :func:`up` before the job's container is
created, :func:`down` after it is removed.

Per attempt, three engine resources, named after the attempt's container and carrying its
labels (so that a rerun after a crash, and ``runner cleanup``, find them):

    <name>-net    an internal bridge network: the engine forwards nothing out of it
    <name>-proxy  tinyproxy (the runner-proxy image) on <name>-net, reached as ``egress-proxy``,
                  and on the policy's upstream network: the only way out
    <name>-netns  the job's network namespace: on <name>-net with every route cut but the one
                  to <name>-net, and the host's bridge address unreachable

The job's container joins ``container:<name>-netns``. Docker 20.10 gives a container on an
internal network a default route through the host's bridge address, and its embedded DNS
forwards names it does not know to the host's resolvers (from the host itself when those are
on loopback): the holder removes the route, and its resolver is ``127.0.0.1`` in that
namespace, where nothing listens, so no name outside the job's network resolves (a lookup
fails within a second: ``timeout:1 attempts:1``). The proxy refuses by default and lets
through only the allowed pairs, matched whole on what the job asked for: ``CONNECT
host:port`` (a TLS tunnel) and ``http://host:port/...`` (plain HTTP, forwarded). An IP
literal, another port, another host, a user-info trick (``http://a:1@b/``) never match, and a
refused name is never resolved; a redirect to another host is a new request, refused the
same way.

The proxy logs every request (tinyproxy's ``LogLevel Info``); :mod:`runner.proxylog` turns that
log into connections, each allowed, refused or incomplete.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.backends.base import Backend, Backstop, ContainerSpec, NetworkInfo
from runner.backends.types import MIB, EgressPlan, HostPort, Limits
from runner.envelope import EgressRecord
from runner.errors import ContainerVanished, ImageUnavailable, InfrastructureError, RunnerError
from runner.proxylog import read_log

ROLE = "org.runner.role"
"""Label naming what an egress resource is: egress-network, egress-proxy, egress-netns."""
LOG_MAX_BYTES = 16 * MIB
"""The proxy's log kept in the record: some 20,000 requests (a request logs 5 to 8 lines)."""
MAX_CONNECTIONS = 1000
"""Connections listed in the envelope; all are counted."""
READY_SECONDS = 60.0
_READY = {"proxy": b"egress-proxy: accepting connections", "netns": b"egress-netns: ready"}
_START = "egress-proxy: accepting connections"
"""The proxy's first line: a kept log without it lost its start."""

PROXY_USER = "10002:10002"
_BOX: dict[str, Any] = {"gpus": "none", "network": "none", "timeout_seconds": 1.0}
PROXY_LIMITS = Limits(
    cpus=2.0, memory_bytes=256 * MIB, memory_swap_bytes=256 * MIB, shm_bytes=MIB, pids=256,
    tmpfs_bytes=MIB, **_BOX,
)  # fmt: skip
"""The proxy runs two threads per connection (at most 100 connections at once)."""
HOLDER_LIMITS = Limits(
    cpus=0.1, memory_bytes=16 * MIB, memory_swap_bytes=16 * MIB, shm_bytes=MIB, pids=16,
    tmpfs_bytes=MIB, cap_add=("NET_ADMIN",), **_BOX,
)  # fmt: skip
"""The holder runs as root with NET_ADMIN alone: it cuts the routes, then sleeps."""


@dataclass(frozen=True)
class Egress:
    """One attempt's egress, as set up (and as the ledger records it, :meth:`as_json`)."""

    network: str
    proxy: str
    holder: str
    allow: tuple[HostPort, ...]
    upstream_network: str
    proxy_image: str
    """The proxy image's id."""

    @property
    def network_mode(self) -> str:
        """How the job's container joins it."""
        return f"container:{self.holder}"

    def as_json(self) -> dict[str, Any]:
        return {
            "network": self.network,
            "proxy": self.proxy,
            "holder": self.holder,
            "allow": [str(x) for x in self.allow],
            "upstreamNetwork": self.upstream_network,
            "proxyImage": self.proxy_image,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> Egress:
        return Egress(
            network=str(data["network"]),
            proxy=str(data["proxy"]),
            holder=str(data["holder"]),
            allow=tuple(HostPort.parse(x) for x in data["allow"]),
            upstream_network=str(data["upstreamNetwork"]),
            proxy_image=str(data["proxyImage"]),
        )


def prepare(backend: Backend, plan: EgressPlan, container_name: str) -> Egress:
    """Name the attempt's egress after its container and pin the proxy image to its id;
    nothing is created yet (the ledger records this before :func:`up`)."""
    info = backend.inspect_image(plan.proxy_image)
    if info is None:
        raise ImageUnavailable(
            f"the egress proxy's image {plan.proxy_image} is not on this host",
            hint="build it (scripts/setup.sh builds runner-proxy:local), or name another in "
            "the host policy's egress.proxyImage",
        )
    return Egress(
        network=f"{container_name}-net",
        proxy=f"{container_name}-proxy",
        holder=f"{container_name}-netns",
        allow=plan.allow,
        upstream_network=plan.upstream_network,
        proxy_image=info.id,
    )


def proxy_rules(allow: tuple[HostPort, ...], lease: str) -> str:
    """The proxy's rules for ``allow`` (JSON): the pairs it lets through, compared whole on
    what the job asked for; everything else is refused."""
    return json.dumps({"lease": lease, "allow": [str(x) for x in allow]}, sort_keys=True)


def _specs(
    eg: Egress, net: NetworkInfo, labels: dict[str, str], deadline: Backstop | None
) -> tuple[ContainerSpec, ContainerSpec]:
    common: dict[str, Any] = {
        "image": eg.proxy_image,
        "command": [],
        "working_dir": "/",
        "mounts": [],
        "backstop": deadline,
        "network": eg.network,
    }
    proxy = ContainerSpec(
        name=eg.proxy,
        entrypoint=["/usr/local/bin/egress-proxy"],
        user=PROXY_USER,
        environment={
            "EGRESS_RULES": proxy_rules(eg.allow, eg.proxy),
            "EGRESS_CLIENTS": net.subnet,
            "NVIDIA_VISIBLE_DEVICES": "void",
        },
        labels={**labels, ROLE: "egress-proxy"},
        limits=PROXY_LIMITS,
        log_max_bytes=2 * LOG_MAX_BYTES,  # the engine's json-file log holds more than its text
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
        labels={**labels, ROLE: "egress-netns"},
        limits=HOLDER_LIMITS,
        dns=("127.0.0.1",),
        # The embedded DNS answers nothing when its resolver does not: fail in a second, not ten.
        dns_options=("timeout:1", "attempts:1"),
        **common,
    )
    return proxy, holder


def up(
    backend: Backend,
    eg: Egress,
    record_dir: Path,
    *,
    labels: dict[str, str],
    deadline: Backstop | None = None,
    ready_seconds: float = READY_SECONDS,
) -> NetworkInfo:
    """Make the attempt's network, proxy and namespace holder, and wait until both containers
    say they are ready; any left under the same names (a runner that crashed) go first. On any
    failure what was made is removed again and the error raised. ``deadline``: the engine ends
    both by itself past it, should no runner come back."""
    record_dir.mkdir(parents=True, exist_ok=True)
    _remove_all(backend, eg)
    try:
        net = backend.create_network(eg.network, {**labels, ROLE: "egress-network"}, internal=True)
        proxy, holder = _specs(eg, net, labels, deadline)
        ids = {"proxy": backend.create(proxy), "netns": backend.create(holder)}
        _together([lambda: backend.start(ids["proxy"]), lambda: backend.start(ids["netns"])])
        _wait_ready(backend, ids, record_dir, ready_seconds)
    except BaseException:
        _remove_all(backend, eg)
        raise
    return net


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
            log = record_dir / f"egress-{role}.start.log"
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
    """Remove the holder and the proxy (at once), then the network; the problems met."""
    problems: list[str] = []

    def remove(name: str) -> Callable[[], None]:
        def call() -> None:
            try:
                backend.remove(name)
            except RunnerError as exc:
                problems.append(str(exc))

        return call

    _together([remove(eg.holder), remove(eg.proxy)])
    try:
        backend.remove_network(eg.network)
    except RunnerError as exc:
        problems.append(str(exc))
    return problems


def down(backend: Backend, eg: Egress, record_dir: Path, job_root: Path) -> EgressRecord:
    """Keep the proxy's log as ``egress.log`` in the attempt's record (at most
    :data:`LOG_MAX_BYTES`), remove the holder, the proxy and the network, and read the log:
    the attempt's egress record, also written as ``egress.json``. Safe to call again (a
    second call finds nothing to remove and returns the record the first wrote); never raises
    the engine's errors, which it lists in ``problems`` (``runner cleanup`` removes what
    stays)."""
    record_dir.mkdir(parents=True, exist_ok=True)
    log, kept = record_dir / "egress.log", record_dir / "egress.json"
    problems: list[str] = []
    saved: int | None = None
    try:
        saved = backend.save_logs(eg.proxy, log, LOG_MAX_BYTES)
    except ContainerVanished:
        pass  # taken down already, or never made
    except RunnerError as exc:
        problems.append(f"the proxy's log could not be read: {exc}")
    problems += _remove_all(backend, eg)
    if saved is None and kept.exists():
        with contextlib.suppress(OSError, ValueError):
            before = EgressRecord.model_validate_json(kept.read_bytes())
            return before.model_copy(update={"problems": [*before.problems, *problems]})
    text = log.read_text(errors="replace") if log.exists() else ""
    connections = read_log(text, eg.proxy)
    record = EgressRecord(
        allow=[str(x) for x in eg.allow],
        upstreamNetwork=eg.upstream_network,
        proxyImage=eg.proxy_image,
        network=eg.network,
        allowed=sum(c.decision == "allowed" for c in connections),
        refused=sum(c.decision == "refused" for c in connections),
        incomplete=sum(c.decision == "incomplete" for c in connections),
        connections=connections[:MAX_CONNECTIONS],
        connectionsDropped=max(len(connections) - MAX_CONNECTIONS, 0),
        log=str(log.relative_to(job_root)),
        # Cut at the cap, or its start lost to the engine's log rotation.
        logTruncated=bool(text) and (len(text) >= LOG_MAX_BYTES or _START not in text[:4096]),
        problems=problems,
    )
    kept.write_text(record.model_dump_json(indent=2) + "\n")
    return record
