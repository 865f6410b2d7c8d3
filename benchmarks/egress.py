"""The egress allowlist: a small job's `runner run` with and without it, and a download's
throughput through its proxy against a direct one."""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks._support import (
    Bench,
    Row,
    interleave,
    ratio_rows,
    sh,
    size_text,
    summary,
)
from runner.testing import outside

DOWNLOAD = r"""
import json, os, socket, sys, time
host, size, times, via = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
buf = bytearray(1 << 20)

def once():
    if via == "proxy":
        name, port = os.environ["HTTPS_PROXY"].removeprefix("http://").split(":")
        s = socket.create_connection((name, int(port)), timeout=60)
        s.sendall(f"CONNECT {host}:8000 HTTP/1.1\r\nHost: {host}:8000\r\n\r\n".encode())
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += s.recv(4096)
        assert b" 200 " in reply.split(b"\r\n")[0], reply
    else:
        s = socket.create_connection((host, 8000), timeout=60)
    t0 = time.perf_counter()
    s.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    got = 0
    while n := s.recv_into(buf):
        got += n
    seconds = time.perf_counter() - t0
    s.close()
    assert got > size, got
    return seconds

out = [once() for _ in range(times)]
text = json.dumps({"seconds": out})
if via == "proxy":  # a runner job: its evidence
    open("/job/output/download.json", "w").write(text)
print(text)
"""
"""Downloads ``size`` bytes from the test host ``times`` times, through a CONNECT tunnel of the
egress proxy (as HTTPS clients do) or directly; the seconds of each, from the request to the
last byte (the connection and the tunnel set up before the clock starts)."""


RELAY = r"""
import importlib.machinery, importlib.util, socket, sys, threading
loader = importlib.machinery.SourceFileLoader("egress_proxy", "/relay/egress-proxy")
proxy = importlib.util.module_from_spec(importlib.util.spec_from_loader("egress_proxy", loader))
loader.exec_module(proxy)
upstream = (sys.argv[1], int(sys.argv[2]))
server = socket.create_server(("0.0.0.0", 8000))
print("ready", flush=True)
while True:
    client, _ = server.accept()
    up = socket.create_connection(upstream)
    for a, b in ((client, up), (up, client)):
        threading.Thread(target=proxy.pump, args=(a, b, threading.Semaphore(0)),
                         daemon=True).start()
"""
"""The egress proxy's own relay loop (``pump`` of images/proxy/egress-proxy, mounted: splice
through a 1 MiB pipe, a thread each way), with no allowlist, no request to read and no log:
what any relay between the job's network and the upstream one costs on this machine, the
floor of the proxied download."""
PROXY_PROGRAM = Path(__file__).resolve().parent.parent / "images" / "proxy" / "egress-proxy"


@contextlib.contextmanager
def _bare_relay(b: Bench, upstream_network: str, host: str) -> Iterator[tuple[str, str]]:
    """An internal network and, on it and on ``upstream_network``, a container running
    :data:`RELAY` to ``host``:8000, as the proxy's slot sits between the two: the network's
    name and the relay's, both removed at the end (before the upstream network is)."""
    tag = b.job_id("relay")
    network, relay = f"{tag}-net", f"{tag}-relay"
    sh("docker", "network", "create", "--internal", "--label", f"bench={b.s.id}", network)
    try:
        sh("docker", "run", "-d", "--name", relay, "--label", f"bench={b.s.id}",
           "--network", network, "--cap-drop", "ALL", "--read-only", "--user", "10001:10001",
           "--mount", f"type=bind,src={PROXY_PROGRAM},dst=/relay/egress-proxy,readonly",
           b.image_id, "python3", "-c", RELAY, host, "8000")  # fmt: skip
        sh("docker", "network", "connect", upstream_network, relay)
        deadline = time.monotonic() + 30
        while "ready" not in sh("docker", "logs", relay):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the bare relay did not start: {sh('docker', 'logs', relay)}")
            time.sleep(0.05)
        yield network, relay
    finally:
        subprocess.run(["docker", "rm", "-f", relay], capture_output=True, check=False)
        subprocess.run(["docker", "network", "rm", network], capture_output=True, check=False)


def _ledger_gaps(job_root: Path) -> tuple[float, float]:
    """From the job's ledger: seconds from attempt.starting to attempt.started (the egress
    coming up, and the job's container created) and from attempt.finished to job.finished
    (the container and the egress going, the evidence read)."""
    at: dict[str, datetime] = {}
    for line in (job_root / "record" / "ledger.jsonl").read_text().splitlines():
        event = json.loads(line)
        at.setdefault(event["type"], datetime.fromisoformat(event["at"].replace("Z", "+00:00")))
    return (
        (at["attempt.started"] - at["attempt.starting"]).total_seconds(),
        (at["job.finished"] - at["attempt.finished"]).total_seconds(),
    )


def fig_egress(b: Bench, reps: int, download: int) -> list[Row]:
    """What a job pays for the egress allowlist: the whole `runner run` of a small job with
    and without it (a slot of the state folder's pool leased, then freed), and a download's
    throughput through the proxy against a direct one, from a test server container on an
    internal network the benchmark makes (nothing leaves the machine)."""
    allowed, big = "allowed.egress.test", "bytes.egress.test"
    roles = {allowed: "allowed", big: f"bytes={download}"}
    runs = {"bench": b.s.id}
    with (
        outside({"bench": b.s.id, "bench.role": "egress-outside"}, roles, runs) as net,
        contextlib.ExitStack() as stack,
    ):
        policy = net.policy(b.s.tmp / "egress-policy.json", [net.pair(allowed), net.pair(big)])
        env = {**b.s.env, "RUNNER_POLICY": str(policy)}
        job = ["python3", "-c", "open('/job/output/r.json', 'w').write('{\"ok\": 1}')"]
        ok: list[dict[str, Any]] = [{
            "measurementId": "ok", "metric": "ok", "unit": "1", "parser": {
                "id": "json.scalar", "version": "1", "evidencePath": "r.json",
                "config": {"pointer": "/ok"}}}]  # fmt: skip
        asks = {"egress": [net.pair(allowed)]}
        with_egress = b.contract(b.s.tmp / "egress-on", command=job, measurements=ok,
                                 with_toy_inputs=False, environment=asks)  # fmt: skip
        without = b.contract(b.s.tmp / "egress-off", command=job, measurements=ok,
                             with_toy_inputs=False)  # fmt: skip
        gaps: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}

        def run(contract: Path, key: str) -> float:
            seconds, envelope, _, _ = b.runner_job(contract, f"egress-{key}", env=env)
            gaps[key].append(_ledger_gaps(Path(envelope["jobDir"])))
            if key == "on" and envelope["egress"]["allowed"] != 0:
                raise RuntimeError("the overhead job made a request")
            return seconds

        run(with_egress, "on")  # warm-up
        run(without, "off")
        xs, ys = interleave(reps, lambda: run(with_egress, "on"), lambda: run(without, "off"))
        diff = statistics.median(xs) - statistics.median(ys)
        up = statistics.median(g[0] for g in gaps["on"]) - statistics.median(
            g[0] for g in gaps["off"])  # fmt: skip
        down = statistics.median(g[1] for g in gaps["on"]) - statistics.median(
            g[1] for g in gaps["off"])  # fmt: skip
        overhead = Row(
            "egress allowlist: a small job's `runner run` wall time",
            "egressOverhead",
            "s",
            "the same job with no network",
            summary(ys),
            summary(xs),
            statistics.median(xs) / statistics.median(ys),
            paired=ratio_rows(xs, ys),
            extra={"differenceSeconds": diff, "upSeconds": up, "downSeconds": down},
            notes=[f"difference of medians: +{diff:.3f} s; from the ledgers, medians against "
                   f"the job without: +{up:.3f} s from attempt.starting to attempt.started "
                   f"(the job's container made; its slot leased just before), +{down:.3f} s from "
                   "attempt.finished to job.finished (its lease ended, its log lines read). The "
                   "slot is made by the warm-up run and leased by every run after it"],
        )  # fmt: skip

        times = 10  # a download takes some 0.1 s: many, for a steady median
        parser = {**ok[0]["parser"], "evidencePath": "download.json",
                  "config": {"pointer": "/seconds/0"}}  # fmt: skip
        fetch = b.contract(
            b.s.tmp / "egress-download",
            command=["python3", "-c", DOWNLOAD, big, str(download), str(times), "proxy"],
            measurements=[{**ok[0], "parser": parser}],
            with_toy_inputs=False,
            environment={"egress": [net.pair(big)]},
        )
        proxied: list[float] = []
        direct: list[float] = []

        def through_proxy() -> float:
            _, envelope, _, _ = b.runner_job(fetch, "egress-download", env=env)
            out = Path(envelope["jobDir"]) / "output" / "download.json"
            proxied.extend(json.loads(out.read_text())["seconds"])
            return 0.0

        def straight() -> float:
            argv = ["docker", "run", "--rm", "--label", f"bench={b.s.id}", "--network",
                    net.network, "--cap-drop", "ALL", "--read-only", "--user", "10001:10001",
                    b.image_id, "python3", "-c", DOWNLOAD, big, str(download), str(times),
                    "direct"]  # fmt: skip
            direct.extend(json.loads(sh(*argv))["seconds"])
            return 0.0

        relayed: list[float] = []
        relay_net, relay = stack.enter_context(_bare_relay(b, net.network, big))

        def through_bare_relay() -> None:
            argv = ["docker", "run", "--rm", "--label", f"bench={b.s.id}", "--network",
                    relay_net, "--cap-drop", "ALL", "--read-only", "--user", "10001:10001",
                    b.image_id, "python3", "-c", DOWNLOAD, relay, str(download), str(times),
                    "direct"]  # fmt: skip
            relayed.extend(json.loads(sh(*argv))["seconds"])

        def straight_and_relayed() -> float:
            straight()
            through_bare_relay()
            return 0.0

        interleave(max(reps // 3, 1), through_proxy, straight_and_relayed)
        mb = download / 1e6
        xs, ys = [mb / x for x in proxied], [mb / y for y in direct]
        zs = [mb / z for z in relayed]
        ratio = statistics.median(xs) / statistics.median(ys)
        floor = statistics.median(zs) / statistics.median(ys)
        speed = Row(
            f"egress allowlist: {size_text(download)} download through the proxy (CONNECT)",
            "egressThroughput",
            "MB/s",
            "a direct download from a container on the server's network",
            summary(ys),
            summary(xs),
            ratio,
            extra={"bytes": download, "bareRelay": summary(zs), "bareRelayRatio": floor},
            notes=[f"{len(xs)} downloads each, {times} per container, timed from the request to "
                   "the last byte inside the container (the tunnel and connection made first)",
                   "the floor: the proxy's relay loop alone (no allowlist, no log) in a container "
                   "between an internal network and the server's, as a slot's proxy sits, "
                   f"relayed the same downloads at {statistics.median(zs):.0f} MB/s, "
                   f"{floor:.2f} times the direct download; the proxy moved "
                   f"{statistics.median(xs) / statistics.median(zs):.2f} times what that bare "
                   "relay did"],
        )  # fmt: skip
    return [overhead, speed]
