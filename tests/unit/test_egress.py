"""The egress allowlist: a job reaches the host:port pairs its contract asks for and its host
policy grants, through the runner's proxy, and nothing else; every request is recorded.

The first part needs no engine: pairs, policy and plan, the proxy's rules, and the stage's
life (up, down, a crashed runner, the sweeper) against the in-memory fake (the proxy program
itself, and its log read back, are tested in tests/integration/test_egress_proxy.py). The second
runs real jobs against an "outside" the test makes itself (tests/support/egress.py): an internal
network with HTTP test hosts on it, named in the host policy as the proxy's upstream. No test
traffic goes anywhere else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from runner.backends.base import ContainerSpec, Mount
from runner.backends.fake import FakeBackend, FakeJob
from runner.backends.types import EgressPlan, HostPort
from runner.contract import Trust, load_contract, with_digest
from runner.core.errors import ContractError, InfrastructureError, PolicyViolation
from runner.egress import slots as egress
from runner.execution import orchestrator, sweeper
from runner.planning import plan, policy
from runner.state.ledger import read_state
from tests.support import (
    SESSION_ID,
    SESSION_LABEL,
    TOY,
    docker,
    json_measurement,
    run_cli,
    start_job,
    write_contract,
)
from tests.support.crash import Crash, CrashingProgress
from tests.support.egress import Outside, left_behind, outside


def _proxy_log(lease: str | None = None) -> bytes:
    """The proxy's log as the engine keeps it (its time first), of a client asking for five
    pairs: two allowed (one connected, one unreachable), two refused, one abandoned."""
    lines: list[dict[str, Any]] = [{"event": "lease", "lease": lease}]
    for i, (target, outcome) in enumerate(
        [("api.example:443", "connected"), ("api.example:443", "unreachable"),
         ("other.example:443", "refused"), ("api.example:80", "refused"), ("x:1", None)]
    ):  # fmt: skip
        common = {"id": i, "lease": lease, "at": "2026-12-01T00:00:00Z"}
        lines.append({**common, "event": "request", "method": "CONNECT", "target": target})
        if outcome is not None:
            lines.append({**common, "event": outcome, "detail": "not on the allowlist"})
    compact = [json.dumps(x, separators=(",", ":")) for x in lines]  # as the proxy writes
    return "".join(f"2026-12-01T00:00:00.1Z {x}\n" for x in compact).encode()


INF = float("inf")


# ------------------------------------------------------------------ pairs, policy and plan


def _contract(tmp_path: Path, **env: Any) -> Any:
    data = json.loads((TOY / "task.json").read_text())
    data["environment"].update({"image": "sha256:" + "ab" * 32, **env})
    data.pop("paper")
    data.pop("repository")
    path = tmp_path / "task.json"
    path.write_text(json.dumps(with_digest(data)))
    return load_contract(path)


def _policy(**fields: Any) -> policy.HostPolicy:
    return policy.HostPolicy(acceptUnsigned=True, **fields).resolved()


GRANT = {"allow": ["api.example:443", "files.example:80"], "upstreamNetwork": "up"}


def _plan(contract: Any, pol: policy.HostPolicy) -> plan.ExecutionPlan:
    return plan.build(contract, pol, job_id="j", host_uid=1000, host_gid=1000)


def test_pairs_are_a_name_and_a_port() -> None:
    """Names compare in lower case; an IP literal, no port, port 0 or 65536 are not pairs."""
    assert HostPort.parse("API.Example:443") == HostPort("api.example", 443)
    for bad in ("10.0.0.1:443", "[::1]:443", "api.example", "api.example:0", "a.b:65536",
                "a_b.example:1", "api.example:443/x", "-a.example:1"):  # fmt: skip
        with pytest.raises(ValueError, match="not host:port"):
            HostPort.parse(bad)


def test_an_ip_literal_in_a_contract_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match=r"\$\.environment\.egress\[0\]"):
        _contract(tmp_path, egress=["10.1.2.3:443"])


def test_a_contract_gets_the_pairs_it_asks_for_never_more(tmp_path: Path) -> None:
    """The plan carries the contract's pairs (here fewer than the policy grants), the job's
    network is ``egress`` and it is told the proxy, for both schemes and spellings."""
    p = _plan(_contract(tmp_path, egress=["API.example:443"]), _policy(egress=GRANT))
    assert p.egress == EgressPlan((HostPort("api.example", 443),), "up", "runner-proxy:local")
    assert p.limits.network == "egress"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert p.environment[name] == "http://egress-proxy:3128"
    assert p.environment["NO_PROXY"] == p.environment["no_proxy"] == ""
    none = _plan(_contract(tmp_path), _policy(egress=GRANT))
    assert none.egress is None and none.limits.network == "none"
    assert "HTTP_PROXY" not in none.environment


@pytest.mark.parametrize(
    ("env", "grant", "message"),
    [
        ({"egress": ["api.example:443", "evil.example:443"]}, GRANT,
         r"\$\.environment\.egress\[1\]: .*evil\.example:443.*grants egress to "
         r"api\.example:443, files\.example:80 only"),
        ({"egress": ["api.example:8443"]}, GRANT, r"\$\.environment\.egress\[0\]"),
        ({"egress": ["api.example:443"]}, None, r"egress\[0\].*grants no egress"),
        ({"egress": ["api.example:443"], "networkAccess": True}, GRANT,
         r"\$\.environment\.egress: .*networkAccess"),
    ],
    ids=["another host", "another port", "no grant", "with networkAccess"],
)  # fmt: skip
def test_what_the_policy_does_not_grant_is_refused(
    tmp_path: Path, env: dict[str, Any], grant: dict[str, Any] | None, message: str
) -> None:
    pol = _policy(egress=grant, allowNetwork=True)
    with pytest.raises(PolicyViolation, match=message):
        policy.check(_contract(tmp_path, **env), pol, now=_now())


def test_runner_verify_shows_the_allowlist_and_refuses_more(tmp_path: Path) -> None:
    """At the command line: the pairs the job will get, or exit 3 naming the pair and the
    fix, before anything runs."""
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"acceptUnsigned": True, "egress": GRANT}))
    (tmp_path / "ok").mkdir()
    (tmp_path / "more").mkdir()
    ok = write_contract(tmp_path / "ok", "sha256:" + "ab" * 32, with_inputs=False,
                        environment={"egress": ["api.example:443"]})  # fmt: skip
    shown = run_cli("verify", str(ok), "--policy", str(policy_file), "--json")
    assert shown.returncode == 0, shown.stderr
    info = json.loads(shown.stdout)
    assert (info["network"], info["egress"]) == ("egress", ["api.example:443"])
    two = {"egress": ["api.example:443", "evil.example:443"]}
    more = write_contract(tmp_path / "more", "sha256:" + "ab" * 32, with_inputs=False,
                          environment=two)  # fmt: skip
    refused = run_cli("verify", str(more), "--policy", str(policy_file))
    assert refused.returncode == 3
    assert "policy_violation" in refused.stderr and "$.environment.egress[1]" in refused.stderr
    assert "egress.allow" in refused.stderr  # the fix


def test_runsc_runs_no_egress(tmp_path: Path) -> None:
    contract = _contract(tmp_path, egress=["api.example:443"], isolation="runsc")
    with pytest.raises(PolicyViolation, match=r"\$\.environment\.egress: runsc"):
        _plan(contract, _policy(egress=GRANT))


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


# ------------------------------------------------------------------ the proxy's rules


def test_the_proxy_rules_are_the_pairs_and_the_lease() -> None:
    rules = egress.proxy_rules((HostPort("api.example", 443), HostPort("files.example", 80)), "L")
    assert json.loads(rules) == {"lease": "L", "allow": ["api.example:443", "files.example:80"]}


# ------------------------------------------------------------------ up and down (fake engine)

READY = b"2026-12-01T00:00:00.0Z egress-proxy: accepting connections on port 3128\n"


def _egress_jobs(
    job: FakeJob, specs: list[ContainerSpec] | None = None
) -> Callable[[ContainerSpec], FakeJob]:
    """The fake engine's containers: the proxy and the holder run until removed, saying they
    are ready; the job does ``job``. Each spec is kept in ``specs``."""

    def jobs(spec: ContainerSpec) -> FakeJob:
        if specs is not None:
            specs.append(spec)
        if spec.name.endswith("-proxy"):
            return FakeJob(seconds=INF, log=READY)
        if spec.name.endswith("-netns"):
            return FakeJob(seconds=INF, log=b"egress-netns: ready\n")
        return job

    return jobs


def _fake(job: FakeJob | None = None, specs: list[ContainerSpec] | None = None) -> FakeBackend:
    fake = FakeBackend(jobs=_egress_jobs(job or FakeJob(), specs))
    fake.add_image("runner-proxy:local", content="proxy")
    fake.create_network("up", {}, internal=False)
    return fake


def _serve(fake: FakeBackend, lines: Callable[[str], bytes] = _proxy_log) -> None:
    """Each slot's proxy logs ``lines(lease)`` for the lease its rules now name (as if the
    job asked it for five pairs), and lines of another lease."""
    for c in fake.containers.values():
        if c.spec.name.endswith("-proxy"):
            rules = json.loads((c.spec.mounts[0].source / "rules.json").read_text())
            if rules["lease"]:
                extra = lines(rules["lease"]) + _proxy_log("another attempt's")
                c.job = replace(c.job, log=c.job.log + extra)


def _slot_resources(fake: FakeBackend) -> tuple[list[str], list[str]]:
    return sorted(c.spec.name for c in fake.containers.values()), sorted(fake.networks)


PLAN = EgressPlan((HostPort("api.example", 443),), "up", "runner-proxy:local")


def test_a_lease_makes_a_hardened_slot_and_down_frees_it(tmp_path: Path) -> None:
    fake, state = _fake(), tmp_path / "state"
    eg = egress.lease(fake, PLAN, "runner-j-a1", state, labels={"run": "mine"})
    specs = {c.spec.name: c.spec for c in fake.containers.values()}
    proxy, holder = specs[eg.proxy], specs[eg.holder]
    assert eg.proxy == f"{eg.slot}-proxy" and eg.lease.startswith("runner-j-a1.")
    assert fake.networks[eg.network].labels[egress.ROLE] == "egress-network"
    assert proxy.network == holder.network == eg.network
    assert proxy.extra_networks == ("up",) and proxy.aliases == ("egress-proxy",)
    assert proxy.user == "10002:10002" and proxy.limits.cap_add == ()
    assert holder.user == "0:0" and holder.limits.cap_add == ("NET_ADMIN",)
    assert holder.dns == ("127.0.0.1",)
    for spec in (proxy, holder):
        lim = spec.limits
        assert lim.cap_drop == ("ALL",) and lim.security_opt == ("no-new-privileges",)
        assert lim.read_only_rootfs and lim.init and lim.pids and lim.memory_bytes <= 256 << 20
        assert spec.image == fake.images[eg.proxy_image].id
        assert spec.labels["run"] == "mine" and spec.labels[egress.SLOT] == eg.slot
    rules_dir = state / "egress" / eg.slot
    assert proxy.mounts == [Mount(rules_dir, "/egress", read_only=True)]
    assert proxy.environment["EGRESS_RULES_FILE"] == "/egress/rules.json"
    subnet, gateway = holder.environment["EGRESS_SUBNET"], holder.environment["EGRESS_GATEWAY"]
    assert proxy.environment["EGRESS_CLIENTS"] == subnet and subnet.startswith("172.")
    rules = json.loads((rules_dir / "rules.json").read_text())
    assert rules == {"lease": eg.lease, "allow": ["api.example:443"]}
    assert holder.environment == {"EGRESS_SUBNET": subnet, "EGRESS_GATEWAY": gateway,
                                  "NVIDIA_VISIBLE_DEVICES": "void"}  # fmt: skip
    made = _slot_resources(fake)

    _serve(fake)
    record = egress.down(fake, eg, tmp_path / "rec", tmp_path)
    assert (record.allowed, record.refused, record.incomplete) == (2, 2, 1)
    assert record.log == "rec/egress.log" and not record.logTruncated
    kept = (tmp_path / "rec" / "egress.log").read_text()
    assert eg.lease in kept and "another attempt" not in kept  # its own lines only
    assert json.loads((rules_dir / "rules.json").read_text()) == {"lease": None, "allow": []}
    assert _slot_resources(fake) == made  # the slot stays, for the next attempt
    assert egress.down(fake, eg, tmp_path / "rec", tmp_path) == record  # again: the same

    again = egress.lease(fake, PLAN, "runner-j-a2", state)
    assert again.slot == eg.slot and _slot_resources(fake) == made  # reused: nothing made
    egress.release(again)
    assert json.loads((rules_dir / "rules.json").read_text())["lease"] is None

    third = egress.lease(fake, PLAN, "runner-j-a3", state)
    _serve(fake, lambda lease: _proxy_log(lease).split(b"\n", 1)[1])  # its first line lost
    assert egress.down(fake, third, tmp_path / "rec3", tmp_path).logTruncated


def test_a_slot_serves_one_attempt_at_a_time(tmp_path: Path) -> None:
    """A slot whose lock is held, or whose job container is still there (its runner died;
    a rerun reattaches to it), is never leased: another is made."""
    fake, state = _fake(), tmp_path / "state"
    first = egress.lease(fake, PLAN, "runner-j-a1", state)
    second = egress.lease(fake, PLAN, "runner-k-a1", state)
    assert first.slot != second.slot
    job = fake.create(replace(_job_spec(), labels=second.job_labels()))
    egress._release(second)  # its runner dies: the lock goes, the job's container stays
    third = egress.lease(fake, PLAN, "runner-l-a1", state)
    assert third.slot not in (first.slot, second.slot)
    fake.remove(job)
    egress.down(fake, second, tmp_path / "rec", tmp_path)  # the rerun ends that attempt
    assert egress.lease(fake, PLAN, "runner-m-a1", state).slot == second.slot


def _job_spec() -> ContainerSpec:
    limits = egress.HOLDER_LIMITS
    return ContainerSpec(name="a-job", image="sha256:" + "0" * 64, entrypoint=[], command=[],
                         user="1:1", working_dir="/", environment={}, labels={}, mounts=[],
                         limits=limits)  # fmt: skip


def test_a_slot_that_fails_to_come_up_leaves_nothing(tmp_path: Path) -> None:
    fake, state = _fake(), tmp_path / "state"
    with pytest.raises(InfrastructureError, match="no network nowhere"):
        egress.lease(fake, replace(PLAN, upstream_network="nowhere"), "runner-j-a1", state)
    fake.jobs = lambda spec: FakeJob(seconds=0.0)  # the proxy ends at once, never ready
    with pytest.raises(InfrastructureError, match="ended as it started"):
        egress.lease(fake, PLAN, "runner-j-a1", state)
    assert fake.containers == {} and list(fake.networks) == ["up"]
    fake.jobs = _egress_jobs(FakeJob())
    assert egress.lease(fake, PLAN, "runner-j-a1", state).slot.endswith("-001")  # not locked


def test_out_of_address_pools_the_free_slots_go_first(tmp_path: Path) -> None:
    """The engine has a few dozen address pools and each slot's network holds one: when none
    is left, free slots (of any state folder) are removed and the network asked for again;
    a busy slot is never touched."""
    fake = _fake()
    create = fake.create_network

    def few_pools(name: str, labels: dict[str, str], *, internal: bool) -> Any:
        if len(fake.networks) >= 3:  # "up" and two slots
            raise InfrastructureError(
                f"creating the network {name}: could not find an available, non-overlapping "
                "IPv4 address pool among the defaults to assign to the network"
            )
        return create(name, labels, internal=internal)

    fake.create_network = few_pools  # type: ignore[method-assign]
    busy = egress.lease(fake, PLAN, "runner-a-a1", tmp_path / "a")
    free = egress.lease(fake, PLAN, "runner-b-a1", tmp_path / "b")
    egress.down(fake, free, tmp_path / "rec", tmp_path)
    third = egress.lease(fake, PLAN, "runner-c-a1", tmp_path / "c")
    assert free.network not in fake.networks and {busy.network, third.network} < set(fake.networks)
    with pytest.raises(InfrastructureError, match="address pool"):  # none free: said so
        egress.lease(fake, PLAN, "runner-d-a1", tmp_path / "d")


def test_an_attempts_end_reaps_the_long_idle_slots_only(tmp_path: Path) -> None:
    fake, state = _fake(), tmp_path / "state"
    old = egress.lease(fake, PLAN, "runner-j-a1", state)
    now = egress.lease(fake, PLAN, "runner-k-a1", state)  # a second slot
    asked: list[dict[str, str]] = []
    finder = fake.find
    fake.find = lambda labels: asked.append(labels) or finder(labels)  # type: ignore[method-assign]
    egress.down(fake, old, tmp_path / "rec1", tmp_path)
    assert asked == [] and len(fake.containers) == 4  # all recent: the engine is not asked
    os.utime(state / "egress" / f"{old.slot}.lock", (0, 0))  # last used long ago
    egress.down(fake, now, tmp_path / "rec2", tmp_path)
    assert asked and {c.spec.labels[egress.SLOT] for c in fake.containers.values()} == {now.slot}


def test_idle_slots_go_and_busy_ones_stay(tmp_path: Path) -> None:
    fake, state = _fake(), tmp_path / "state"
    held = egress.lease(fake, PLAN, "runner-j-a1", state)
    free = egress.lease(fake, PLAN, "runner-k-a1", state)
    egress.down(fake, free, tmp_path / "rec", tmp_path)
    assert egress.reap(fake) == []  # used a moment ago
    assert egress.reap(fake, idle_seconds=0.0, dry_run=True) == [free.slot]
    assert egress.reap(fake, idle_seconds=0.0) == [free.slot]
    names, networks = _slot_resources(fake)
    assert names == [held.holder, held.proxy] and networks == [held.network, "up"]
    report = sweeper.sweep(fake, state_dir=state)
    assert report["removed"] == [] and _slot_resources(fake) == (names, networks)
    egress.down(fake, held, tmp_path / "rec2", tmp_path)
    report = sweeper.sweep(fake, state_dir=state)
    assert [x["name"] for x in report["removed"]] == [held.slot]
    assert fake.containers == {} and list(fake.networks) == ["up"]


def _options(tmp_path: Path, grant: dict[str, Any]) -> orchestrator.RunOptions:
    loaded = policy.LoadedPolicy(_policy(egress=grant), "test")
    return orchestrator.RunOptions(
        state_dir=tmp_path / "state", policy=loaded, trust=Trust(keys=[]), tick_seconds=0.01,
        heartbeat_seconds=0.05, stop_grace_seconds=0.05,
    )  # fmt: skip


def _toy(tmp_path: Path, image: str, tag: str = "1") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return write_contract(
        tmp_path, image, command=["true", tag], environment={"egress": ["api.example:443"]},
        measurements=[json_measurement("r.json", "/ok")],
    )  # fmt: skip


def _writes(mounts: dict[str, Path]) -> None:
    (mounts["/job/output"] / "r.json").write_text('{"ok": 1}')


def _asks(fake: FakeBackend) -> Callable[[dict[str, Path]], None]:
    """The job's work: its evidence, and five requests of its proxy."""

    def work(mounts: dict[str, Path]) -> None:
        _writes(mounts)
        _serve(fake)

    return work


def test_a_run_behind_the_allowlist_and_a_rerun_after_a_crash(tmp_path: Path) -> None:
    """The job joins its slot's namespace; the slot is freed, not removed, when it ends, and
    the envelope counts its requests. A runner killed mid-run leaves the job in its slot; the
    next run reattaches, then frees it."""
    specs: list[ContainerSpec] = []
    fake = _fake(specs=specs)
    fake.jobs = _egress_jobs(FakeJob(seconds=0.3, work=_asks(fake)), specs)
    image = fake.add_image("job:1", content="job").id
    contract = _toy(tmp_path / "c1", image)
    env = orchestrator.as_json(
        orchestrator.run(
            contract, _options(tmp_path, GRANT), backend=fake, progress=CrashingProgress()
        )
    )
    assert env["status"] == "succeeded", env["failure"]
    assert env["limits"]["network"] == "egress" and env["allocation"]["network"] == "egress"
    assert (env["egress"]["allowed"], env["egress"]["refused"]) == (2, 2)
    ledger = read_state(Path(env["jobDir"]) / "record" / "ledger.jsonl")
    eg = ledger.attempts[0].starting["egress"]
    assert eg["allow"] == ["api.example:443"]
    (job,) = [s for s in specs if s.name.endswith("-a1")]
    assert job.network == f"container:{eg['holder']}"
    assert job.labels[egress.SLOT] == eg["slot"]
    assert job.environment["HTTPS_PROXY"] == "http://egress-proxy:3128"
    slot = _slot_resources(fake)
    assert slot == (sorted([eg["holder"], eg["proxy"]]), sorted([eg["network"], "up"]))

    contract = _toy(tmp_path / "c2", image, tag="2")
    with pytest.raises(Crash):
        orchestrator.run(contract, _options(tmp_path, GRANT), backend=fake,
                         progress=CrashingProgress(fake))  # fmt: skip
    fake.frozen = False
    assert len(fake.containers) == 3  # the slot, and the job in it
    env = orchestrator.as_json(
        orchestrator.run(
            contract, _options(tmp_path, GRANT), backend=fake, progress=CrashingProgress()
        )
    )
    assert env["status"] == "succeeded" and env["budget"]["attempts"] == 1
    assert _slot_resources(fake) == slot  # one slot served both


def test_a_new_attempt_ends_the_lease_a_vanished_one_left(tmp_path: Path) -> None:
    fake = _fake(FakeJob(seconds=INF))
    image = fake.add_image("job:1", content="job").id
    contract = _toy(tmp_path, image)
    with pytest.raises(Crash):
        orchestrator.run(contract, _options(tmp_path, GRANT), backend=fake,
                         progress=CrashingProgress(fake))  # fmt: skip
    fake.frozen = False
    job = next(c for c in fake.containers.values() if c.spec.name.endswith("-a1"))
    fake.remove(job.id)  # the job's container vanished; its slot did not
    fake.jobs = _egress_jobs(FakeJob(seconds=0.1, work=_writes))
    env = orchestrator.as_json(
        orchestrator.run(
            contract, _options(tmp_path, GRANT), backend=fake, progress=CrashingProgress()
        )
    )
    assert env["status"] == "succeeded" and env["budget"]["attempts"] == 2
    assert len(fake.containers) == 2 and len(fake.networks) == 2  # one slot, reused
    assert (Path(env["jobDir"]) / "record" / "attempts" / "1" / "egress.json").exists()


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
    assert proxy["Config"]["User"] == "10002:10002" and not proxy["HostConfig"]["CapAdd"]
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
