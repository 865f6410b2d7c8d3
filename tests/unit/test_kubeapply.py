"""runner/scheduling/kubernetes/apply.py against a stand-in for the Kubernetes API server
(tests/support/kubeapi.py:
a small recording HTTP server on 127.0.0.1, not a cluster; no cluster runs here), driven by the
official Python client: the NetworkPolicy is created before the Job, the bytes sent are the
manifests rendered and checked, a second apply creates nothing, an object of another contract
refuses the whole apply, dry-run stores nothing, the kubeconfig and context choose the server,
and the Job's conditions are read back without writing the ledger."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.app import host
from runner.core.errors import (
    HostConfigError,
    InfrastructureError,
    JobNotFound,
    PolicyViolation,
)
from runner.execution import stageonly
from runner.execution.options import RunOptions
from runner.scheduling.kubernetes import apply, plan, render
from tests.support import write_contract
from tests.support.clock import VirtualClock
from tests.support.kubeapi import ApiServer, api_server, write_kubeconfig

DIGEST_IMAGE = "registry.example/runner-cpu@sha256:" + "ab" * 32
NS = "repro"


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with api_server() as s:
        yield s


@pytest.fixture
def kubeconfig(tmp_path: Path, server: ApiServer) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", {"only": server}, "only")


def rendered(tmp_path: Path, *, job_id: str | None = None, **env: Any) -> plan.Rendered:
    folder = tmp_path / "contract"
    folder.mkdir(parents=True, exist_ok=True)
    contract = write_contract(folder, DIGEST_IMAGE, environment=env or None)
    loaded, trust = host.load(allow_unsigned=True)
    return plan.rendered(
        contract, loaded, trust, state_dir=tmp_path / "state", job_id=job_id, namespace=NS
    )


def with_namespace(m: dict[str, Any]) -> dict[str, Any]:
    return {**m, "metadata": {**m["metadata"], "namespace": NS}}


def test_networkpolicy_is_created_before_the_job_exactly_as_rendered(
    tmp_path: Path, server: ApiServer, kubeconfig: Path
) -> None:
    """Both objects are read first, then the NetworkPolicy is POSTed, then the Job; each body
    is the rendered manifest byte for byte (as JSON), with the bearer token of the context."""
    r = rendered(tmp_path)
    out = apply.apply(r.manifests, namespace=NS, kubeconfig=kubeconfig)
    assert [(o["kind"], o["action"]) for o in out] == [
        ("NetworkPolicy", "created"),
        ("Job", "created"),
    ]
    assert [(q.method, q.collection) for q in server.requests] == [
        ("GET", "networkpolicies"),
        ("GET", "jobs"),
        ("POST", "networkpolicies"),
        ("POST", "jobs"),
    ]
    posts = server.writes()
    by_kind = {m["kind"]: m for m in r.manifests}
    assert posts[0].body == with_namespace(by_kind["NetworkPolicy"])
    assert posts[1].body == with_namespace(by_kind["Job"])
    assert all(q.query == {} for q in posts)  # no dryRun
    assert {q.authorization for q in server.requests} == {f"Bearer {server.token}"}
    assert (("Job", NS, r.name)) in server.objects


def test_applying_again_reports_what_exists_and_creates_nothing(
    tmp_path: Path, server: ApiServer, kubeconfig: Path
) -> None:
    """Idempotent: the same job and contract applied twice is created once."""
    r = rendered(tmp_path)
    first = apply.apply(r.manifests, namespace=NS, kubeconfig=kubeconfig)
    before = len(server.writes())
    again = apply.apply(r.manifests, namespace=NS, kubeconfig=kubeconfig)
    assert [o["action"] for o in again] == ["exists", "exists"]
    assert [o["uid"] for o in again] == [o["uid"] for o in first]
    assert len(server.writes()) == before == 2


def test_an_object_of_another_contract_refuses_the_whole_apply(
    tmp_path: Path, server: ApiServer, kubeconfig: Path
) -> None:
    """A Job of the same name made for another contract (the same job id, another digest)
    is refused before anything is created: not even the NetworkPolicy is POSTed."""
    r = rendered(tmp_path)
    other = copy.deepcopy(next(m for m in r.manifests if m["kind"] == "Job"))
    other["metadata"]["labels"][render.CONTRACT_LABEL] = "f" * 40
    other["metadata"]["annotations"][f"{render.PREFIX}/contract-digest"] = "sha256:" + "f" * 64
    server.put(other, NS)
    with pytest.raises(PolicyViolation, match="exists and is not this job's") as caught:
        apply.apply(r.manifests, namespace=NS, kubeconfig=kubeconfig)
    assert "sha256:" + "f" * 64 in caught.value.message
    assert server.writes() == []
    assert ("NetworkPolicy", NS, r.name) not in server.objects


def test_an_object_not_made_by_the_runner_is_refused(
    tmp_path: Path, server: ApiServer, kubeconfig: Path
) -> None:
    """A NetworkPolicy of that name without the runner's labels is someone else's."""
    r = rendered(tmp_path)
    server.put({"kind": "NetworkPolicy", "metadata": {"name": r.name}, "spec": {}}, NS)
    with pytest.raises(PolicyViolation, match="or not by the runner"):
        apply.apply(r.manifests, namespace=NS, kubeconfig=kubeconfig)
    assert server.writes() == []


def test_dry_run_sends_dryrun_all_and_nothing_is_stored(
    tmp_path: Path, server: ApiServer, kubeconfig: Path
) -> None:
    """With dry_run each create carries dryRun=All (the server stores nothing), in the same
    order; a real apply afterwards still creates both."""
    r = rendered(tmp_path)
    out = apply.apply(r.manifests, namespace=NS, kubeconfig=kubeconfig, dry_run=True)
    assert [o["action"] for o in out] == ["dry-run", "dry-run"]
    posts = server.writes()
    assert [q.query for q in posts] == [{"dryRun": ["All"]}, {"dryRun": ["All"]}]
    assert [q.collection for q in posts] == ["networkpolicies", "jobs"]
    assert server.objects == {}
    real = apply.apply(r.manifests, namespace=NS, kubeconfig=kubeconfig)
    assert [o["action"] for o in real] == ["created", "created"]


def test_the_context_chooses_the_server_and_its_credentials(tmp_path: Path) -> None:
    """Two clusters in one kubeconfig: without --context the current one gets every request;
    with context 'b', only b does, with b's token. A missing kubeconfig, or a context it does
    not have, is a host configuration error naming it, and nothing is sent."""
    r = rendered(tmp_path)
    with api_server() as a, api_server() as b:
        config = write_kubeconfig(tmp_path / "kubeconfig", {"a": a, "b": b}, "a")
        apply.apply(r.manifests, namespace=NS, kubeconfig=config, dry_run=True)
        assert len(a.requests) == 4 and b.requests == []
        apply.apply(r.manifests, namespace=NS, kubeconfig=config, context="b")
        assert len(a.requests) == 4 and len(b.requests) == 4
        assert {q.authorization for q in b.requests} == {f"Bearer {b.token}"}
        with pytest.raises(HostConfigError, match="'nope'"):
            apply.apply(r.manifests, namespace=NS, kubeconfig=config, context="nope")
        (tmp_path / "garbage").write_text("clusters: [\n  - {name: \n")
        with pytest.raises(HostConfigError, match="garbage cannot be used"):
            apply.apply(r.manifests, namespace=NS, kubeconfig=tmp_path / "garbage")
        with pytest.raises(HostConfigError, match="missing-kubeconfig"):
            apply.apply(r.manifests, namespace=NS, kubeconfig=tmp_path / "missing-kubeconfig")
        assert len(a.requests) == 4 and len(b.requests) == 4


def test_kubeconfig_from_the_environment_is_read_when_called(
    tmp_path: Path, server: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --kubeconfig, $KUBECONFIG as it is at the call (after the client was first
    imported), a ':' list whose missing files are passed over."""
    r = rendered(tmp_path)
    config = write_kubeconfig(tmp_path / "from-env", {"e": server}, "e")
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{config}")
    out = apply.apply(r.manifests, namespace=NS, dry_run=True)
    assert [o["action"] for o in out] == ["dry-run", "dry-run"] and len(server.requests) == 4
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(HostConfigError, match=r"\$KUBECONFIG \(.*missing\)"):
        apply.apply(r.manifests, namespace=NS)


def test_refused_credentials_and_rejected_objects_are_errors(
    tmp_path: Path, server: ApiServer
) -> None:
    """A wrong token (401) and an object the server rejects (422, its message quoted) are
    infrastructure errors naming the request; after a rejected Job the NetworkPolicy stays
    (it protects nothing but denies all) and a retry creates only the Job."""
    r = rendered(tmp_path)
    wrong = ApiServer(token="not-" + server.token, url=server.url)
    config = write_kubeconfig(tmp_path / "wrong", {"w": wrong}, "w")
    with pytest.raises(InfrastructureError, match=r"refused GET NetworkPolicy .*401"):
        apply.apply(r.manifests, namespace=NS, kubeconfig=config)
    good = write_kubeconfig(tmp_path / "good", {"s": server}, "s")
    server.fail_with[("POST", "Job")] = (422, 'Job.batch "x" is invalid: spec.template: bad')
    with pytest.raises(InfrastructureError, match=r"POST Job .* with 422: .*is invalid"):
        apply.apply(r.manifests, namespace=NS, kubeconfig=good)
    assert ("NetworkPolicy", NS, r.name) in server.objects
    del server.fail_with[("POST", "Job")]
    out = apply.apply(r.manifests, namespace=NS, kubeconfig=good)
    assert [o["action"] for o in out] == ["exists", "created"]


def test_a_job_made_meanwhile_is_reported_if_it_is_this_jobs(
    tmp_path: Path, server: ApiServer, kubeconfig: Path
) -> None:
    """Between the read (404) and the create (409) another submit of the same job made the
    Job: it is read again and reported as existing; made for another contract, refused."""
    r = rendered(tmp_path)
    job = next(m for m in r.manifests if m["kind"] == "Job")
    server.put(job, NS)
    server.hide_once.add("Job")
    out = apply.apply(r.manifests, namespace=NS, kubeconfig=kubeconfig)
    assert [o["action"] for o in out] == ["created", "exists"]
    assert [(q.method, q.collection) for q in server.requests][-2:] == [
        ("POST", "jobs"),
        ("GET", "jobs"),
    ]
    other = copy.deepcopy(job)
    other["metadata"]["annotations"][f"{render.PREFIX}/contract-digest"] = "sha256:" + "e" * 64
    server.put(other, NS)
    server.hide_once.add("Job")
    with pytest.raises(PolicyViolation, match="made meanwhile by another contract"):
        apply.apply(r.manifests, namespace=NS, kubeconfig=kubeconfig)


def test_hostile_answers_are_errors_not_tracebacks(
    tmp_path: Path, server: ApiServer, kubeconfig: Path
) -> None:
    """A server answering a list, or a Job whose labels, annotations and status are of the
    wrong types: an infrastructure error, a refusal, or a plain status; never a crash."""
    r = rendered(tmp_path)
    server.answer_with[("GET", "NetworkPolicy")] = ["not", "an", "object"]
    with pytest.raises(InfrastructureError, match="no JSON object"):
        apply.apply(r.manifests, namespace=NS, kubeconfig=kubeconfig)
    del server.answer_with[("GET", "NetworkPolicy")]
    odd = {"kind": "Job", "metadata": {"name": r.name, "labels": ["x"], "annotations": "y"},
           "status": ["z"]}  # fmt: skip
    server.answer_with[("GET", "Job")] = odd
    with pytest.raises(PolicyViolation, match="or not by the runner"):
        apply.apply(r.manifests, namespace=NS, kubeconfig=kubeconfig)
    with pytest.raises(PolicyViolation, match="not the runner's Job"):
        apply.status(r.plan.job_id, namespace=NS, kubeconfig=kubeconfig)
    job = copy.deepcopy(next(m for m in r.manifests if m["kind"] == "Job"))
    job["status"] = {"conditions": ["bad", {"type": "Failed"}], "active": "many"}
    server.answer_with[("GET", "Job")] = job
    got = apply.status(r.plan.job_id, namespace=NS, kubeconfig=kubeconfig)
    assert (got["state"], got["ended"]) == ("pending", False)


def test_an_unreachable_server_is_an_infrastructure_error(tmp_path: Path) -> None:
    """Nothing listens on the kubeconfig's server: an infrastructure error naming it."""
    r = rendered(tmp_path)
    with api_server() as gone:
        config = write_kubeconfig(tmp_path / "kubeconfig", {"g": gone}, "g")
    with pytest.raises(InfrastructureError, match=f"{gone.url} did not answer"):
        apply.apply(r.manifests, namespace=NS, kubeconfig=config)


def test_manifests_that_break_the_rules_or_the_namespace_are_never_sent(
    tmp_path: Path, server: ApiServer, kubeconfig: Path
) -> None:
    """Edited manifests (backoffLimit 1) and a namespace other than the rendered one are
    refused before any request."""
    r = rendered(tmp_path)
    edited = copy.deepcopy(r.manifests)
    next(m for m in edited if m["kind"] == "Job")["spec"]["backoffLimit"] = 1
    with pytest.raises(PolicyViolation, match="backoffLimit"):
        apply.apply(edited, namespace=NS, kubeconfig=kubeconfig)
    with pytest.raises(PolicyViolation, match="rendered for namespace 'repro'"):
        apply.apply(r.manifests, namespace="other", kubeconfig=kubeconfig)
    with pytest.raises(PolicyViolation, match="DNS label"):
        apply.apply(r.manifests, namespace="Bad_NS", kubeconfig=kubeconfig)
    assert server.requests == []


def _job_status(kind: str, reason: str) -> dict[str, Any]:
    return {
        "conditions": [
            {"type": kind, "status": "True", "reason": reason, "message": f"{reason} said"}
        ],
        "startTime": "2026-12-01T10:00:00Z",
        "failed": 1 if kind == "Failed" else 0,
        "succeeded": 1 if kind == "Complete" else 0,
    }


def test_status_reads_the_conditions_and_writes_nothing(
    tmp_path: Path, server: ApiServer, kubeconfig: Path
) -> None:
    """pending (no pod active), running, complete, failed and deadline_exceeded from the
    Job's conditions; without a state folder, status() writes nothing: the ledger is the same
    bytes (its submitted attempt still in flight) before and after."""
    folder = tmp_path / "contract"
    folder.mkdir()
    contract = write_contract(folder, DIGEST_IMAGE)
    loaded, trust = host.load(allow_unsigned=True)
    state = tmp_path / "state"
    staged = stageonly.stage(
        contract, RunOptions(state_dir=state, policy=loaded, trust=trust), host_uid=0, host_gid=0
    )
    out = apply.submit(contract, loaded, trust, namespace=NS, state_dir=state,
                           kubeconfig=kubeconfig)  # fmt: skip
    ledger = (staged.job_dir / "record" / "ledger.jsonl").read_bytes()
    jid, name = out["jobId"], out["name"]

    def state_now() -> dict[str, Any]:
        return apply.status(jid, namespace=NS, kubeconfig=kubeconfig)

    assert state_now()["state"] == "pending" and state_now()["ended"] is False
    server.set_status(NS, name, {"active": 1})
    assert state_now()["state"] == "running"
    server.set_status(NS, name, _job_status("Complete", "CompletionsReached"))
    done = state_now()
    assert (done["state"], done["ended"], done["succeeded"]) == ("complete", True, 1)
    assert done["contractDigest"] == out["contractDigest"]
    server.set_status(NS, name, _job_status("Failed", "BackoffLimitExceeded"))
    assert state_now()["state"] == "failed"
    server.set_status(NS, name, _job_status("Failed", "DeadlineExceeded"))
    late = state_now()
    assert (late["state"], late["reason"]) == ("deadline_exceeded", "DeadlineExceeded")
    assert (staged.job_dir / "record" / "ledger.jsonl").read_bytes() == ledger
    assert not (staged.job_dir / "result.json").exists()
    with pytest.raises(JobNotFound):
        apply.status("no-such-job", namespace=NS, kubeconfig=kubeconfig)


def test_wait_polls_until_the_job_ends(
    tmp_path: Path, server: ApiServer, kubeconfig: Path, virtual_clock: VirtualClock
) -> None:
    """wait() returns once a condition ends the Job (set during its fifth pause), having seen
    each state once, one poll after; with a short timeout it returns the last status, not
    ended, having paused no longer than the timeout."""
    r = rendered(tmp_path)
    apply.apply(r.manifests, namespace=NS, kubeconfig=kubeconfig)
    seen: list[str] = []

    def ends_at_the_fifth_pause(_: float) -> None:
        if len(virtual_clock.sleeps) == 5:
            server.set_status(NS, r.name, _job_status("Failed", "DeadlineExceeded"))

    virtual_clock.on_sleep = ends_at_the_fifth_pause
    got = apply.wait(
        r.plan.job_id, namespace=NS, kubeconfig=kubeconfig, poll_seconds=0.1, timeout=30,
        on_status=lambda s: seen.append(s["state"]),
    )  # fmt: skip
    assert got["state"] == "deadline_exceeded" and seen == ["pending", "deadline_exceeded"]
    assert virtual_clock.sleeps == [0.1] * 5
    virtual_clock.on_sleep = None
    other = rendered(tmp_path / "other", job_id="other-job")
    apply.apply(other.manifests, namespace=NS, kubeconfig=kubeconfig)
    before = len(virtual_clock.sleeps)
    cut = apply.wait("other-job", namespace=NS, kubeconfig=kubeconfig, poll_seconds=0.05,
                         timeout=0.2)  # fmt: skip
    assert cut["ended"] is False and cut["state"] == "pending"
    pauses = virtual_clock.sleeps[before:]
    assert sum(pauses) == pytest.approx(0.2) and max(pauses) <= 0.05 + 1e-9


def test_a_job_of_that_name_not_the_runners_is_refused_by_status(
    tmp_path: Path, server: ApiServer, kubeconfig: Path
) -> None:
    """status() refuses a Job under the job's name that lacks the runner's labels."""
    name = render.object_name("some-job")
    server.put({"kind": "Job", "metadata": {"name": name, "labels": {}}, "spec": {}}, NS)
    with pytest.raises(PolicyViolation, match="not the runner's Job"):
        apply.status("some-job", namespace=NS, kubeconfig=kubeconfig)


def test_submit_refuses_a_job_that_was_not_staged(
    tmp_path: Path, server: ApiServer, kubeconfig: Path
) -> None:
    """submit() without `runner stage` first is refused and sends nothing; with apply=False
    it only renders (no request)."""
    folder = tmp_path / "contract"
    folder.mkdir()
    contract = write_contract(folder, DIGEST_IMAGE)
    loaded, trust = host.load(allow_unsigned=True)
    state = tmp_path / "state"
    with pytest.raises(PolicyViolation, match="is not staged"):
        apply.submit(contract, loaded, trust, namespace=NS, state_dir=state,
                         kubeconfig=kubeconfig)  # fmt: skip
    out = apply.submit(contract, loaded, trust, namespace=NS, state_dir=state,
                           kubeconfig=kubeconfig, apply=False, require_staged=False)  # fmt: skip
    assert out["applied"] == [] and out["manifests"]["kind"] == "List"
    assert server.requests == []


def test_submit_applies_a_staged_job_with_the_budget_of_its_ledger(
    tmp_path: Path, server: ApiServer, kubeconfig: Path
) -> None:
    """After `runner stage`, submit() renders from the ledger (the whole budget, nothing
    spent) and creates both objects; a dry run writes nothing to the ledger, a submit records
    attempt 1 (starting before the create, started with the Job's uid after)."""
    folder = tmp_path / "contract"
    folder.mkdir()
    contract = write_contract(folder, DIGEST_IMAGE)
    loaded, trust = host.load(allow_unsigned=True)
    state = tmp_path / "state"
    staged = stageonly.stage(
        contract, RunOptions(state_dir=state, policy=loaded, trust=trust), host_uid=0, host_gid=0
    )
    ledger = (staged.job_dir / "record" / "ledger.jsonl").read_bytes()
    out = apply.submit(contract, loaded, trust, namespace=NS, state_dir=state,
                           kubeconfig=kubeconfig, dry_run=True)  # fmt: skip
    assert out["budgetFrom"] == "ledger" and out["activeDeadlineSeconds"] == 15 * 60
    assert [a["action"] for a in out["applied"]] == ["dry-run", "dry-run"]
    assert out["submitted"] is False
    out = apply.submit(contract, loaded, trust, namespace=NS, state_dir=state,
                           kubeconfig=kubeconfig)  # fmt: skip
    assert out["submitted"] is True
    assert [(a["kind"], a["action"]) for a in out["applied"]] == [
        ("NetworkPolicy", "created"),
        ("Job", "created"),
    ]
    after = (staged.job_dir / "record" / "ledger.jsonl").read_bytes()
    assert after.startswith(ledger)
    events = [json.loads(line) for line in after[len(ledger) :].splitlines()]
    assert [e["type"] for e in events] == ["attempt.starting", "attempt.started"]
    assert events[0]["data"]["activeDeadlineSeconds"] == 15 * 60 and out["attempt"] == 1
    assert (
        events[1]["data"]["containerId"]
        == server.objects[("Job", NS, out["name"])]["metadata"]["uid"]
    )


def test_the_client_is_imported_only_to_talk_to_a_cluster() -> None:
    """Importing kubernetes/apply.py, and rendering with `runner render`, never imports the
    kubernetes package (importing its client and config took about 0.7 s here); apply() does."""
    code = (
        "import sys, runner.scheduling.kubernetes.apply, runner.scheduling.kubernetes.plan, "
        "runner.cli.render, runner.cli.stage; "
        "print('kubernetes' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False"


def test_submit_wait_and_cancel_through_the_cli(
    tmp_path: Path, server: ApiServer, kubeconfig: Path
) -> None:
    """`runner stage`, then `runner submit --to kubernetes` creates both objects and records
    where; `runner status` names the Job; `runner wait` exits 0 once the Job completes (the
    API server's word: no envelope); `runner cancel` deletes the Job, then its NetworkPolicy.
    A Slurm option with --to kubernetes is a usage error, and a refused contract beside a good
    one creates nothing."""
    from tests.support import run_cli

    folder = tmp_path / "contract"
    folder.mkdir()
    contract = write_contract(folder, DIGEST_IMAGE)
    state = tmp_path / "state"
    common = ["--state-dir", str(state), "--allow-unsigned"]
    staged = run_cli("stage", str(contract), *common, "--json")
    assert staged.returncode == 0, staged.stderr
    k8s = ["--to", "kubernetes", "--namespace", NS, "--kubeconfig", str(kubeconfig)]
    wrong = run_cli("submit", str(contract), *k8s, "--partition", "debug", *common)
    assert (
        wrong.returncode == 2 and "--partition is not an option of --to kubernetes" in wrong.stderr
    )
    (tmp_path / "bad").mkdir()
    bad = write_contract(tmp_path / "bad", DIGEST_IMAGE, change=_networked)
    refused = run_cli("submit", str(contract), str(bad), *k8s, *common)
    assert refused.returncode == 3, refused.stderr
    assert server.writes() == [], "nothing created when one contract is refused"
    sub = run_cli("submit", str(contract), *k8s, *common, "--json")
    assert sub.returncode == 0, sub.stderr
    (got,) = json.loads(sub.stdout)
    jid, name = got["jobId"], got["name"]
    assert [(a["kind"], a["action"]) for a in got["applied"]] == [
        ("NetworkPolicy", "created"),
        ("Job", "created"),
    ]
    status = run_cli("status", jid, "--state-dir", str(state), "--json")
    assert json.loads(status.stdout)["kubernetes"]["name"] == name
    timer = threading.Timer(
        1.0, server.set_status, (NS, name, _job_status("Complete", "CompletionsReached"))
    )
    timer.start()
    try:
        waited = run_cli("wait", jid, "--state-dir", str(state), "--poll", "0.2", "--json")
    finally:
        timer.cancel()
    assert waited.returncode == 0, waited.stderr
    (end,) = json.loads(waited.stdout)
    assert (end["to"], end["kubernetesState"], end["status"]) == ("kubernetes", "complete",
                                                                  "succeeded")  # fmt: skip
    assert end["envelope"] is None
    cancel = run_cli("cancel", jid, "--state-dir", str(state), "--json")
    assert cancel.returncode == 0, cancel.stderr
    (gone,) = json.loads(cancel.stdout)
    assert gone["deleted"] is True and gone["networkPolicy"] == "deleted"
    deletes = [(q.method, q.collection) for q in server.requests if q.method == "DELETE"]
    assert deletes == [("DELETE", "jobs"), ("DELETE", "networkpolicies")]
    assert server.objects == {}


def _networked(data: dict[str, Any]) -> None:
    data["jobId"] = "networked"
    data["environment"]["networkAccess"] = True


def test_delete_takes_the_job_by_uid_then_only_its_own_networkpolicy(
    tmp_path: Path, server: ApiServer, kubeconfig: Path
) -> None:
    """delete() sends the Job's DELETE with Foreground propagation and the uid it read (only
    that Job), and deletes the NetworkPolicy once the Job is gone, only when it carries this
    job's label: another one of that name is kept."""
    r = rendered(tmp_path)
    apply.apply(r.manifests, namespace=NS, kubeconfig=kubeconfig)
    uid = server.objects[("Job", NS, r.name)]["metadata"]["uid"]
    policy = server.objects[("NetworkPolicy", NS, r.name)]
    policy["metadata"]["labels"][render.JOB_LABEL] = "someone-else"
    gone = apply.delete(r.plan.job_id, namespace=NS, kubeconfig=kubeconfig)
    assert gone["networkPolicy"] == "kept: not this job's"
    (job_delete,) = [q for q in server.requests if q.method == "DELETE"]
    assert job_delete.collection == "jobs"
    assert job_delete.body is not None
    assert job_delete.body["propagationPolicy"] == "Foreground"
    assert job_delete.body["preconditions"] == {"uid": uid}
    assert ("NetworkPolicy", NS, r.name) in server.objects
    assert ("Job", NS, r.name) not in server.objects
