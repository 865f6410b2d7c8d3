"""The thirteenth hostile review (the egress allowlist), on the real engine: a job granted a
pair reaches nothing on this host past its routes.

The namespace holder cut every route but the one to the slot's own network and made the
host's bridge address unreachable; but ``SO_DONTROUTE`` (a link-scope lookup, which matches
the subnet's route and skips the ``unreachable`` one) and UDP broadcast need no route, and the
host answered on its bridge address: any service of this host listening on every address
(sshd, a DNS forwarder, a proxy, an engine's TCP socket) was reached, both ways. The slot's
network now gives this host no address at all."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import SESSION_ID, SESSION_LABEL, json_measurement, run_cli, write_contract
from tests.support.egress import Outside, left_behind, outside

pytestmark = [pytest.mark.hostile, pytest.mark.docker]

ALLOWED = "allowed.egress.test"
JOB_LABELS = {SESSION_LABEL: SESSION_ID, "egress-test": "round13"}

ESCAPE = r"""
import json, socket, sys
tcp_port, udp_port = int(sys.argv[1]), int(sys.argv[2])
route = open("/proc/net/route").read().split("\n")[1].split()
net = int.from_bytes(bytes.fromhex(route[1]), "little")
mask = int.from_bytes(bytes.fromhex(route[7]), "little")
gateway = socket.inet_ntoa((net + 1).to_bytes(4, "big"))
broadcast = socket.inet_ntoa((net | (~mask & 0xFFFFFFFF)).to_bytes(4, "big"))
probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
probe.connect((socket.gethostbyname("egress-proxy"), 9))
me = probe.getsockname()[0]
out = {"gateway": gateway, "broadcast": broadcast}

def attempt(name, fn):
    try:
        out[name] = {"ok": repr(fn())}
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {exc}"}

def tcp(dontroute):
    s = socket.socket()
    if dontroute:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_DONTROUTE, 1)
    s.settimeout(3)
    s.connect((gateway, tcp_port))
    return s.recv(100)

def udp(to, *, dontroute=False, bind=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    if dontroute:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_DONTROUTE, 1)
    if bind:
        s.bind((bind, 0))
    s.settimeout(3)
    s.sendto(b"from-the-job", (to, udp_port))
    return s.recvfrom(100)

attempt("tcp", lambda: tcp(False))
attempt("tcp_dontroute", lambda: tcp(True))
attempt("udp_dontroute", lambda: udp(gateway, dontroute=True))
attempt("udp_directed_broadcast", lambda: udp(broadcast))
attempt("udp_limited_broadcast", lambda: udp("255.255.255.255", bind=me))
json.dump(out, open("/job/output/escape.json", "w"), indent=1)
json.dump({"done": 1}, open("/job/output/m.json", "w"))
"""


class _Host:
    """This host's services on every address: a TCP one that greets, a UDP one that echoes;
    what reached them."""

    def __init__(self) -> None:
        self.tcp = socket.socket()
        self.tcp.bind(("0.0.0.0", 0))  # noqa: S104 - the point: listening on every address
        self.tcp.listen(4)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("0.0.0.0", 0))  # noqa: S104
        self.reached: list[str] = []
        for target in (self._greet, self._echo):
            threading.Thread(target=target, daemon=True).start()

    def _greet(self) -> None:
        while True:
            try:
                conn, peer = self.tcp.accept()
            except OSError:
                return
            self.reached.append(f"tcp from {peer}")
            conn.sendall(b"hello from the host\n")
            conn.close()

    def _echo(self) -> None:
        while True:
            try:
                data, peer = self.udp.recvfrom(100)
            except OSError:
                return
            self.reached.append(f"udp from {peer}")
            self.udp.sendto(b"pong " + data, peer)

    def close(self) -> None:
        self.tcp.close()
        self.udp.close()


@pytest.fixture
def host() -> Iterator[_Host]:
    services = _Host()
    try:
        yield services
    finally:
        services.close()


@pytest.fixture
def the_outside() -> Iterator[Outside]:
    labels = {SESSION_LABEL: SESSION_ID, "egress-test": "round13-outside"}
    with outside(labels, {ALLOWED: "allowed"}, JOB_LABELS) as net:
        yield net


def test_a_job_granted_a_pair_reaches_nothing_on_this_host(
    tmp_path: Path, image_id: str, the_outside: Outside, host: _Host
) -> None:
    net = the_outside
    policy_file = net.policy(tmp_path / "policy.json", [net.pair(ALLOWED)])
    ports = [str(host.tcp.getsockname()[1]), str(host.udp.getsockname()[1])]
    contract = write_contract(
        tmp_path, image_id, command=["python3", "-c", ESCAPE, *ports],
        environment={"egress": [net.pair(ALLOWED)]},
        measurements=[json_measurement("m.json", "/done")],
    )  # fmt: skip
    proc = run_cli(
        "run", str(contract), "--state-dir", str(tmp_path / "state"), "--json",
        "--policy", str(policy_file), "--label", f"{SESSION_LABEL}={SESSION_ID}",
        "--label", "egress-test=round13",
    )  # fmt: skip
    envelope = json.loads(proc.stdout)
    assert proc.returncode == 0, (envelope.get("failure"), proc.stderr[-3000:])
    tried = json.loads((Path(envelope["jobDir"]) / "output" / "escape.json").read_text())
    for name in ("tcp", "tcp_dontroute", "udp_dontroute", "udp_directed_broadcast",
                 "udp_limited_broadcast"):  # fmt: skip
        assert "error" in tried[name], (name, tried)
    assert host.reached == [], tried
    assert left_behind(JOB_LABELS) == {"containers": [], "networks": []}
