"""The egress allowlist: a job reaches the host:port pairs its contract asks for and its host
policy grants, through the runner's proxy, and nothing else; every request is recorded.

The first part needs no engine: pairs, policy and plan, the proxy's rules, and the stage's
life (up, down, a crashed runner, the sweeper) against the in-memory fake (the proxy program
itself, and its log read back, are tested in tests/integration/test_egress_proxy.py). The second
runs real jobs against an "outside" the test makes itself (tests/support/egress.py): an internal
network with HTTP test hosts on it, named in the host policy as the proxy's upstream. No test
traffic goes anywhere else.

The tests that need the engine are in tests/integration/test_egress.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
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
from runner.egress.local import host_addresses
from runner.execution import orchestrator, sweeper
from runner.planning import plan, policy
from runner.state.ledger import read_state
from tests.support import (
    TOY,
    json_measurement,
    run_cli,
    write_contract,
)
from tests.support.crash import Crash, CrashingProgress


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
    assert proxy.user == egress.proxy_user(eg.pool, eg.slot) and proxy.limits.cap_add == ()
    uid = int(proxy.user.partition(":")[0])  # its own, mapped by a user-namespaced engine
    assert egress.PROXY_UID_BASE <= uid < 0x7FFE0000  # systemd's unused range
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
    assert rules.pop("refuse", []) == [*host_addresses()]  # this host's own: never led to
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


def _capped(tally: bool) -> Callable[[str], bytes]:
    """A lease's log that reached its cap, with (or without) the tally the proxy writes once
    the lease ends: 40 requests in all, of which the five logged."""

    def lines(lease: str) -> bytes:
        capped = {"event": "log-capped", "lease": lease, "at": "2026-12-01T00:00:00Z"}
        counts = {"requests": 40, "refused": 30, "connected": 6, "unreachable": 1}
        end = [capped] + ([{"event": "tally", "lease": lease, **counts}] if tally else [])
        compact = [json.dumps(x, separators=(",", ":")) for x in end]
        text = "".join(f"2026-12-01T00:00:01Z {x}\n" for x in compact)
        return _proxy_log(lease) + text.encode()

    return lines


def test_a_capped_log_counts_every_request_by_the_proxys_tally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its cap the proxy lists nothing more of a lease, and counts on: the record's
    counts are its tally's (40 requests, 3 with no outcome), its list the logged five."""
    fake, state = _fake(), tmp_path / "state"
    eg = egress.lease(fake, PLAN, "runner-j-a1", state)
    _serve(fake, _capped(tally=True))
    record = egress.down(fake, eg, tmp_path / "rec", tmp_path)
    assert (record.allowed, record.refused, record.incomplete) == (7, 30, 3)
    assert len(record.connections) == 5 and record.logTruncated and record.problems == []
    assert (tmp_path / "rec" / "egress.log").read_text().count('"event":"tally"') == 1

    monkeypatch.setattr(egress, "TALLY_SECONDS", 0.3)
    again = egress.lease(fake, PLAN, "runner-j-a2", state)
    _serve(fake, _capped(tally=False))  # the proxy ended before it saw the lease end
    record = egress.down(fake, again, tmp_path / "rec2", tmp_path)
    assert (record.allowed, record.refused, record.incomplete) == (2, 2, 1)
    assert record.logTruncated and "tally" in record.problems[0]


def test_the_policys_private_networks_reach_the_proxys_rules(tmp_path: Path) -> None:
    grant = {**GRANT, "privateNetworks": ["10.20.0.0/16", "fd00::/8"]}
    p = _plan(_contract(tmp_path, egress=["api.example:443"]), _policy(egress=grant))
    assert p.egress is not None and p.egress.private_networks == ("10.20.0.0/16", "fd00::/8")
    fake = _fake()
    eg = egress.lease(fake, p.egress, "runner-j-a1", tmp_path / "state")
    assert json.loads(Path(eg.rules).read_text())["networks"] == ["10.20.0.0/16", "fd00::/8"]
    assert egress.Egress.from_json(eg.as_json()) == eg
    record = egress.down(fake, eg, tmp_path / "rec", tmp_path)
    assert record.privateNetworks == ["10.20.0.0/16", "fd00::/8"]
    with pytest.raises(ValueError, match=r"host bits set: write a range as its network"):
        _policy(egress={**GRANT, "privateNetworks": ["10.20.0.1/16"]})


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
    # each slot's proxy its own uid: one job's pipes cannot use up another slot's pipe pages
    users = {c.spec.user for c in fake.containers.values() if c.spec.name.endswith("-proxy")}
    assert len(users) == 3
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
