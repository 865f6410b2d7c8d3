"""The egress allowlist: a job reaches the host:port pairs its contract asks for and its host
policy grants, through the runner's proxy, and nothing else; every request is recorded.

The first part needs no engine: pairs, policy and plan, the proxy's rules, and the stage's
life (up, down, a crashed runner, the sweeper) against the in-memory fake (the proxy program
itself, and its log read back, are tested in tests/integration/test_egress_proxy.py). The second
runs real jobs against an "outside" the test makes itself (tests/support/egress.py): an internal
network with HTTP test hosts on it, named in the host policy as the proxy's upstream. No test
traffic goes anywhere else.

The tests that need no engine are in tests/unit/test_egress.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.egress import slots as egress
from runner.state.ledger import read_state
from tests.support import (
    SESSION_ID,
    SESSION_LABEL,
    docker,
    json_measurement,
    run_cli,
    start_job,
    write_contract,
)
from tests.support.egress import Outside, left_behind, outside

# ------------------------------------------------------------------ real jobs, real engine

ALLOWED, OTHER, REDIRECT = "allowed.egress.test", "other.egress.test", "redirect.egress.test"

PROBE = r"""
import json, os, socket, subprocess, sys, urllib.error, urllib.request
allowed_ip = sys.argv[1]
A, O, R = "allowed.egress.test", "other.egress.test", "redirect.egress.test"
proxy = os.environ["HTTPS_PROXY"].removeprefix("http://").split(":")
out = {}

def attempt(name, fn):
    try:
        out[name] = {"ok": fn()}
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {exc}", "errno": getattr(exc, "errno", None)}

def get(url, opener=urllib.request.build_opener()):
    try:
        with opener.open(url, timeout=10) as r:
            return [r.status, r.read().decode(), r.url]
    except urllib.error.HTTPError as exc:
        return [exc.code, exc.headers.get("Location"), exc.url]

class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args):
        return None

def tunnel(target):
    s = socket.create_connection((proxy[0], int(proxy[1])), timeout=10)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = s.recv(4096)
        if not chunk:
            break
        reply += chunk
    status, body = reply.split(b"\r\n")[0].decode(), ""
    if " 200 " in status:
        s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        data = reply.split(b"\r\n\r\n", 1)[1]
        while chunk := s.recv(4096):
            data += chunk
        body = data.decode().split("\r\n\r\n", 1)[-1]
    s.close()
    return [status, body]

def direct(host):
    socket.create_connection((host, 8000), timeout=5).close()
    return "connected"

attempt("get_allowed", lambda: get(f"http://{A}:8000/"))
attempt("connect_allowed", lambda: tunnel(f"{A}:8000"))
attempt("direct_allowed_name", lambda: direct(A))
attempt("direct_allowed_ip", lambda: direct(allowed_ip))
attempt("get_other", lambda: get(f"http://{O}:8000/"))
attempt("connect_other", lambda: tunnel(f"{O}:8000"))
attempt("connect_ip_literal", lambda: tunnel(f"{allowed_ip}:8000"))
attempt("connect_other_port", lambda: tunnel(f"{A}:8001"))
attempt("connect_dns_tunnel", lambda: tunnel(f"bWFkZS11cA.x.{O}:8000"))
once = urllib.request.build_opener(NoRedirect)
attempt("redirect_first_hop", lambda: get(f"http://{R}:8000/", once))
attempt("redirect_followed", lambda: get(f"http://{R}:8000/"))
attempt("resolve_outside_name", lambda: str(socket.getaddrinfo(A, 8000)))
out["getent_invalid"] = subprocess.run(["getent", "hosts", "x.invalid"]).returncode
out["routes"] = [line.split()[:4] for line in open("/proc/net/route").read().splitlines()[1:]]
out["resolv_conf"] = open("/etc/resolv.conf").read()
out["proxy_env"] = {k: v for k, v in os.environ.items() if "proxy" in k.lower()}
json.dump(out, open("/job/output/egress-probe.json", "w"), indent=1)
"""


JOB_LABELS = {SESSION_LABEL: SESSION_ID, "egress-test": "job"}
"""The runs' own labels: the runner puts them on the job's container, proxy, holder and
network alike."""


@pytest.fixture
def the_outside() -> Iterator[Outside]:
    """The test's outside: an allowed host, one the contract does not ask for (though the
    policy grants it), and one that redirects to that other host."""
    labels = {SESSION_LABEL: SESSION_ID, "egress-test": "outside"}
    roles = {ALLOWED: "allowed", OTHER: "other", REDIRECT: f"redirect=http://{OTHER}:8000/"}
    with outside(labels, roles, JOB_LABELS) as net:
        yield net


def _session_run(
    contract: Path, state: Path, policy_file: Path, *extra: str
) -> tuple[int, dict[str, Any], str]:
    proc = run_cli(
        "run", str(contract), "--state-dir", str(state), "--json", "--policy", str(policy_file),
        "--label", f"{SESSION_LABEL}={SESSION_ID}", "--label", "egress-test=job", *extra,
    )  # fmt: skip
    try:
        return proc.returncode, json.loads(proc.stdout), proc.stderr
    except json.JSONDecodeError:
        pytest.fail(f"stdout is not an envelope:\n{proc.stdout}\n{proc.stderr}")


@pytest.mark.docker
def test_the_allowlist_holds_from_inside_a_job(
    tmp_path: Path, image_id: str, the_outside: Outside
) -> None:
    """From inside the job: the allowed host works through the proxy, plain and tunnelled;
    direct connections to it (name or address) fail, as do a proxied request and a CONNECT to
    a host the contract did not ask for, an IP-literal CONNECT, another port, a name that
    would tunnel data through DNS, and the second hop of a redirect; no name outside the job's
    network resolves, and the job has no default route. Each request is in the envelope and
    in record/attempts/1/egress.log, and nothing is left behind."""
    net = the_outside
    ip = net.hosts[ALLOWED]
    policy_file = net.policy(tmp_path / "policy.json",
                             [net.pair(ALLOWED), net.pair(REDIRECT), net.pair(OTHER)])  # fmt: skip
    contract = write_contract(
        tmp_path, image_id, command=["python3", "-c", PROBE, ip],
        environment={"egress": [net.pair(ALLOWED), net.pair(REDIRECT)]},
        measurements=[json_measurement("egress-probe.json", "/get_allowed/ok/0")],
    )  # fmt: skip
    code, env, err = _session_run(contract, tmp_path / "state", policy_file)
    assert code == 0, (env["failure"], err)
    probe = json.loads((Path(env["jobDir"]) / "output" / "egress-probe.json").read_text())

    assert probe["get_allowed"]["ok"][:2] == [200, "hello from allowed\n"]
    assert probe["connect_allowed"]["ok"] == ["HTTP/1.1 200 Connection established",
                                              "hello from allowed\n"]  # fmt: skip
    assert "gaierror" in probe["direct_allowed_name"]["error"]
    assert probe["direct_allowed_ip"]["errno"] == 101, probe["direct_allowed_ip"]  # unreachable
    assert probe["get_other"]["ok"][0] == 403
    for name in ("connect_other", "connect_ip_literal", "connect_other_port",
                 "connect_dns_tunnel"):  # fmt: skip
        assert probe[name]["ok"][0].startswith("HTTP/1.1 403 "), (name, probe[name])
    assert probe["redirect_first_hop"]["ok"][:2] == [302, f"http://{OTHER}:8000/"]
    assert probe["redirect_followed"]["ok"] == [403, None, f"http://{OTHER}:8000/"]
    assert "gaierror" in probe["resolve_outside_name"]["error"]
    assert probe["getent_invalid"] == 2  # not found
    assert all(dest != "00000000" for _, dest, *_ in probe["routes"]), probe["routes"]
    assert [r for r in probe["routes"] if r[3] == "0001"] != []  # its own network's route only
    assert [line for line in probe["resolv_conf"].splitlines() if line.startswith("nameserver")
            ] == ["nameserver 127.0.0.11"]  # fmt: skip
    assert set(probe["proxy_env"]) == {"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy",
                                       "NO_PROXY", "no_proxy"}  # fmt: skip

    eg = env["egress"]
    assert eg["allow"] == sorted([net.pair(ALLOWED), net.pair(REDIRECT)])
    assert eg["upstreamNetwork"] == net.network and eg["problems"] == []
    seen = [(c["method"], c["target"], c["decision"], c["detail"]) for c in eg["connections"]]
    a, o, r = f"{ALLOWED}:8000", f"{OTHER}:8000", f"{REDIRECT}:8000"
    assert seen == [
        ("GET", f"http://{a}/", "allowed", "connected"),
        ("CONNECT", a, "allowed", "connected"),
        ("GET", f"http://{o}/", "refused", "not on the allowlist"),
        ("CONNECT", o, "refused", "not on the allowlist"),
        ("CONNECT", f"{ip}:8000", "refused", "not on the allowlist"),
        ("CONNECT", f"{ALLOWED}:8001", "refused", "port not allowed"),
        ("CONNECT", f"bWFkZS11cA.x.{o}", "refused", "not on the allowlist"),
        ("GET", f"http://{r}/", "allowed", "connected"),
        ("GET", f"http://{r}/", "allowed", "connected"),
        ("GET", f"http://{o}/", "refused", "not on the allowlist"),
    ]
    assert (eg["allowed"], eg["refused"], eg["incomplete"]) == (4, 6, 0)
    log = (Path(env["jobDir"]) / eg["log"]).read_text()
    assert eg["log"] == "record/attempts/1/egress.log"
    assert '"event":"refused"' in log and "bWFkZS11cA" in log
    onward = [x for x in log.splitlines() if '"event":"connected"' in x or "unreachable" in x]
    assert len(onward) == 4 and not [x for x in onward if "bWFkZS11cA" in x]  # never resolved
    assert left_behind(JOB_LABELS) == {"containers": [], "networks": []}


SLOW_PROBE = r"""
import json, time, urllib.request
time.sleep(float(__import__("sys").argv[1]))
status = urllib.request.urlopen("http://allowed.egress.test:8000/", timeout=10).status
json.dump({"status": status}, open("/job/output/late.json", "w"))
"""


def _running_job(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    """The name of the job's container once it runs (its proxy and holder run first)."""
    deadline = time.monotonic() + timeout
    while True:
        names = docker("ps", "--format", "{{.Names}}", "--filter",
                       f"label={SESSION_LABEL}={SESSION_ID}", "--filter", "label=egress-test=job"
                       ).stdout.split()  # fmt: skip
        jobs = [n for n in names if n.endswith("-a1")]
        if jobs:
            return jobs[0]
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the job's container did not start"
        time.sleep(0.1)


def _inspect(name: str) -> dict[str, Any]:
    data: list[dict[str, Any]] = json.loads(docker("inspect", name).stdout)
    return data[0]


@pytest.mark.docker
def test_kill_9_of_the_runner_then_its_rerun_leaves_nothing(
    tmp_path: Path, image_id: str, the_outside: Outside
) -> None:
    """The runner is killed outright while its job runs: proxy, holder and network stay for
    the job (the proxy and holder boxed like a job, the holder's resolver 127.0.0.1 and its
    only capability NET_ADMIN); the rerun reattaches, the job reaches the allowed host, and
    then nothing of the job is left."""
    net = the_outside
    policy_file = net.policy(tmp_path / "policy.json", [net.pair(ALLOWED)])
    contract = write_contract(
        tmp_path, image_id, command=["python3", "-c", SLOW_PROBE, "6"],
        environment={"egress": [net.pair(ALLOWED)]},
        measurements=[json_measurement("late.json", "/status")],
    )  # fmt: skip
    state = tmp_path / "state"
    proc = start_job(contract, state, "--policy", str(policy_file), "--label", "egress-test=job")
    try:
        job = _running_job(proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    slot = _inspect(job)["Config"]["Labels"][egress.SLOT]
    proxy, holder = _inspect(f"{slot}-proxy"), _inspect(f"{slot}-netns")
    assert _inspect(job)["HostConfig"]["NetworkMode"] == f"container:{holder['Id']}"
    for c in (proxy, holder):
        hc = c["HostConfig"]
        assert c["State"]["Running"] and hc["ReadonlyRootfs"] and hc["Init"]
        assert hc["CapDrop"] == ["ALL"] and hc["SecurityOpt"] == ["no-new-privileges"]
        assert hc["Memory"] == hc["MemorySwap"] > 0 and hc["PidsLimit"] > 0 and hc["NanoCpus"] > 0
        assert c["Config"]["Labels"][SESSION_LABEL] == SESSION_ID
    pool = proxy["Config"]["Labels"][egress.POOL]
    assert proxy["Config"]["User"] == egress.proxy_user(pool, slot)
    assert not proxy["HostConfig"]["CapAdd"]
    assert sorted(proxy["NetworkSettings"]["Networks"]) == sorted([f"{slot}-net", net.network])
    assert [m["Destination"] for m in proxy["Mounts"]] == ["/egress"]
    assert not proxy["Mounts"][0]["RW"]
    assert holder["HostConfig"]["CapAdd"] == ["NET_ADMIN"]
    assert holder["HostConfig"]["Dns"] == ["127.0.0.1"]
    assert list(holder["NetworkSettings"]["Networks"]) == [f"{slot}-net"]
    assert docker("network", "inspect", "--format", "{{.Internal}}", f"{slot}-net"
                  ).stdout.strip() == "true"  # fmt: skip

    code, env, err = _session_run(contract, state, policy_file)
    assert code == 0, (env["failure"], err)
    assert env["budget"]["attempts"] == 1 and env["attempts"][0]["how"] == "reattached"
    assert (env["egress"]["allowed"], env["egress"]["refused"]) == (1, 0)
    assert left_behind(JOB_LABELS) == {"containers": [], "networks": []}


@pytest.mark.docker
def test_runner_cleanup_removes_free_slots(
    tmp_path: Path, image_id: str, the_outside: Outside
) -> None:
    """A job's slot stays after it, free, for the next attempt; `runner cleanup` removes
    it (proxy, holder, network), and a second job makes a new one."""
    net = the_outside
    policy_file = net.policy(tmp_path / "policy.json", [net.pair(ALLOWED)])
    contract = write_contract(
        tmp_path, image_id, command=["python3", "-c", SLOW_PROBE, "0"],
        environment={"egress": [net.pair(ALLOWED)]},
        measurements=[json_measurement("late.json", "/status")],
    )  # fmt: skip
    code, env, err = _session_run(contract, tmp_path / "state", policy_file)
    assert code == 0, (env["failure"], err)
    eg = read_state(Path(env["jobDir"]) / "record" / "ledger.jsonl").attempts[0].starting["egress"]
    assert _inspect(eg["proxy"])["State"]["Running"]  # kept for the next attempt
    cleanup = run_cli("cleanup", "--state-dir", str(tmp_path / "state"), "--json")
    assert cleanup.returncode == 0, cleanup.stderr
    assert eg["slot"] in {x["name"] for x in json.loads(cleanup.stdout)["removed"]}
    for name in (eg["proxy"], eg["holder"]):
        assert docker("ps", "-aq", "--filter", f"name=^{name}$").stdout.strip() == ""
    assert docker("network", "ls", "-q", "--filter", f"name=^{eg['network']}$").stdout == ""
