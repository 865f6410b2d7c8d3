"""One budget on Kubernetes: each submission is an attempt in the job's ledger, its end recorded
once from the API server's times when `runner job wait`, `status` or `cancel` sees it, and a
resubmit gets only what is left (runner/scheduling/kubernetes/attempts.py). Against the
stand-in API server (tests/support/kubeapi.py, which serves the Job's pods with the times a
test gives them), on the virtual clock."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from runner.app import host
from runner.cli import dispatch
from runner.contract import Trust
from runner.core import clock
from runner.core.errors import InfrastructureError, JobBusy, JobNotFound, ResourceExhausted
from runner.execution import stageonly
from runner.execution.options import RunOptions
from runner.planning.policy import LoadedPolicy
from runner.scheduling.kubernetes import apply, attempts, plan
from runner.state.jobdir import JobDir
from runner.state.ledger import Ledger, read_state, verify_file
from tests.support import write_contract
from tests.support.clock import VirtualClock
from tests.support.kubeapi import ApiServer, api_server, write_kubeconfig

DIGEST_IMAGE = "registry.example/runner-cpu@sha256:" + "ab" * 32
NS = "repro"
BUDGET = 15 * 60  # the contract write_contract writes


@pytest.fixture
def virtual_clock() -> Any:
    """The conftest's virtual clock, started on a whole second (as the API's times are)."""
    with clock.use(VirtualClock(datetime.now(UTC).replace(microsecond=0))) as virtual:
        yield virtual


@pytest.fixture
def server() -> Any:
    with api_server() as s:
        yield s


@pytest.fixture
def kubeconfig(tmp_path: Path, server: ApiServer) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", {"only": server}, "only")


@dataclass
class Staged:
    contract: Path
    loaded: LoadedPolicy
    trust: Trust
    state: Path
    job: JobDir
    kubeconfig: Path

    @property
    def job_id(self) -> str:
        return self.job.root.name

    def submit(self) -> dict[str, Any]:
        """As `runner cluster submit --to kubernetes` does: submit, then record where."""
        got = apply.submit(self.contract, self.loaded, self.trust, namespace=NS,
                           state_dir=self.state, kubeconfig=self.kubeconfig)  # fmt: skip
        plan.record_submission(self.state, {**got, "kubeconfig": str(self.kubeconfig)})
        return got

    def status(self) -> dict[str, Any]:
        return apply.status(self.job_id, namespace=NS, kubeconfig=self.kubeconfig,
                            state_dir=self.state)  # fmt: skip

    def finished(self) -> list[dict[str, Any]]:
        return [a.finished for a in read_state(self.job.ledger).attempts if a.finished]


@pytest.fixture
def staged(tmp_path: Path, kubeconfig: Path, virtual_clock: VirtualClock) -> Staged:
    folder = tmp_path / "contract"
    folder.mkdir()
    contract = write_contract(folder, DIGEST_IMAGE)
    loaded, trust = host.load(allow_unsigned=True)
    state = tmp_path / "state"
    got = stageonly.stage(
        contract, RunOptions(state_dir=state, policy=loaded, trust=trust), host_uid=0, host_gid=0
    )
    return Staged(contract, loaded, trust, state, JobDir(got.job_dir), kubeconfig)


def iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_ABSENT = object()


def pod_status(start: Any, started: Any, finished: Any = _ABSENT) -> dict[str, Any]:
    """A pod whose one container has terminated (``finished`` _ABSENT: no finishedAt)."""
    term: dict[str, Any] = {"exitCode": 0, "reason": "Completed", "startedAt": started}
    if finished is not _ABSENT:
        term["finishedAt"] = finished
    return {"phase": "Succeeded", "startTime": start,
            "containerStatuses": [{"name": "job", "state": {"terminated": term}}]}  # fmt: skip


def ended(server: ApiServer, name: str, kind: str = "Complete", reason: str = "Done") -> None:
    server.set_status(NS, name, {"conditions": [{"type": kind, "status": "True",
                                                  "reason": reason}]})  # fmt: skip


def test_wait_records_the_attempt_once_from_the_pods_times(
    staged: Staged, server: ApiServer, virtual_clock: VirtualClock
) -> None:
    """submit, the pod runs 100 s by the API's times, wait() sees the Job complete: attempt 1
    is charged 101 s (whole seconds, one added), from the API's start and end; a second wait
    and a status() append nothing (the ledger's bytes are the same), the status without taking
    the job's lock (a runner may hold it); the chain is intact."""
    out = staged.submit()
    t0 = virtual_clock.now()
    server.add_pod(NS, out["name"], pod_status(iso(t0 + timedelta(seconds=3)),
                                               iso(t0 + timedelta(seconds=10)),
                                               iso(t0 + timedelta(seconds=103))))  # fmt: skip
    virtual_clock.advance(400)
    ended(server, out["name"])
    got = apply.wait(staged.job_id, namespace=NS, kubeconfig=staged.kubeconfig,
                     state_dir=staged.state, poll_seconds=1)  # fmt: skip
    assert got["recorded"]["recorded"] == "now"
    (fin,) = staged.finished()
    assert fin["seconds"] == 101.0 and fin["how"] == "kubernetes-complete"
    assert (fin["startFrom"], fin["endFrom"]) == ("api", "api")
    assert fin["classification"] == "unverified"  # never final: no envelope from the API's word
    job_uid = server.objects[("Job", NS, out["name"])]["metadata"]["uid"]
    assert fin["jobUid"] == job_uid and fin["podUid"]
    before = staged.job.ledger.read_bytes()
    again = apply.wait(staged.job_id, namespace=NS, kubeconfig=staged.kubeconfig,
                       state_dir=staged.state)  # fmt: skip
    assert again["recorded"]["recorded"] == "already"
    with staged.job.locked():  # a runner holding the job: an end recorded already is read
        assert staged.status()["recorded"]["recorded"] == "already"  # without the lock
    assert staged.job.ledger.read_bytes() == before
    assert verify_file(staged.job.ledger) == []
    assert read_state(staged.job.ledger).consumed == 101.0


def test_job_status_records_the_end_through_the_cli(
    staged: Staged, server: ApiServer, virtual_clock: VirtualClock, capsys: Any
) -> None:
    """`runner job status JOB` of a Kubernetes attempt in flight asks the API server: running,
    nothing recorded; ended (DeadlineExceeded), the attempt recorded (charged 61 s), once: a
    second `runner job status` shows the same and appends nothing."""
    out = staged.submit()
    args = ["job", "status", staged.job_id, "--state-dir", str(staged.state), "--json"]
    server.set_status(NS, out["name"], {"active": 1})
    capsys.readouterr()
    assert dispatch(args) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["state"] == "attempt 1 in flight (or its runner died)"
    assert "running" in shown["container"]["state"]
    t0 = virtual_clock.now()
    server.add_pod(NS, out["name"], pod_status(iso(t0), iso(t0), iso(t0 + timedelta(seconds=60))))
    virtual_clock.advance(90)
    ended(server, out["name"], "Failed", "DeadlineExceeded")
    assert dispatch(args) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["state"] == "not running"
    assert shown["consumedSeconds"] == 61.0 and shown["remainingSeconds"] == BUDGET - 61
    assert shown["attempts"][0]["how"] == "kubernetes-deadline_exceeded"
    before = staged.job.ledger.read_bytes()
    assert dispatch(args) == 0
    assert json.loads(capsys.readouterr().out)["consumedSeconds"] == 61.0
    assert dispatch(args[:-1]) == 0  # as people read it
    text = capsys.readouterr().out
    assert "61.0 s  unverified (kubernetes-deadline_exceeded)" in text
    assert staged.job.ledger.read_bytes() == before


def test_cancel_records_the_attempt_cancelled_from_its_start_to_the_deletion(
    staged: Staged, server: ApiServer, virtual_clock: VirtualClock, capsys: Any
) -> None:
    """`runner job cancel` of a running Job: its pod (started 5 s after the submit) is read
    before the delete, and the attempt is charged from the submit (no end from the API: its
    start alone is not believed) to when the Job was seen gone (60 s after the submit): 60 s,
    ``endFrom: observed``; a status afterwards (the Job gone) appends nothing."""
    out = staged.submit()
    t0 = virtual_clock.now()
    running = {"phase": "Running", "startTime": iso(t0 + timedelta(seconds=5)),
               "containerStatuses": [{"name": "job", "state": {"running": {
                   "startedAt": iso(t0 + timedelta(seconds=8))}}}]}  # fmt: skip
    server.add_pod(NS, out["name"], running)
    server.set_status(NS, out["name"], {"active": 1})
    virtual_clock.advance(60)
    assert dispatch(["job", "cancel", staged.job_id, "--state-dir", str(staged.state)]) == 0
    (fin,) = staged.finished()
    assert fin["classification"] == "cancelled" and fin["how"] == "kubernetes-cancelled"
    assert fin["seconds"] == pytest.approx(60.0) and fin["endFrom"] == "observed"
    assert "had not terminated" in fin["because"]
    assert server.objects == {}
    before = staged.job.ledger.read_bytes()
    with pytest.raises(JobNotFound):
        staged.status()
    assert staged.job.ledger.read_bytes() == before


def test_a_resubmit_gets_what_is_left_and_replaces_the_ended_job(
    staged: Staged, server: ApiServer, virtual_clock: VirtualClock
) -> None:
    """Attempt 1 used 121 s; the resubmit deletes its ended Job (by uid) and creates attempt
    2's with activeDeadlineSeconds 900 - 121 = 779 and RUNNER_ATTEMPT 2; the ledger's attempt 2
    records that deadline."""
    first = staged.submit()
    old_uid = server.objects[("Job", NS, first["name"])]["metadata"]["uid"]
    t0 = virtual_clock.now()
    server.add_pod(
        NS, first["name"], pod_status(iso(t0), iso(t0), iso(t0 + timedelta(seconds=120)))
    )
    virtual_clock.advance(200)
    ended(server, first["name"], "Failed", "BackoffLimitExceeded")
    assert staged.status()["recorded"]["seconds"] == 121.0
    second = staged.submit()
    assert second["activeDeadlineSeconds"] == BUDGET - 121 and second["attempt"] == 2
    job = server.objects[("Job", NS, second["name"])]
    assert job["metadata"]["uid"] != old_uid
    assert job["spec"]["activeDeadlineSeconds"] == BUDGET - 121
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RUNNER_ATTEMPT"] == "2"
    deletes = [q for q in server.requests if q.method == "DELETE" and q.collection == "jobs"]
    assert [q.body["preconditions"]["uid"] for q in deletes if q.body] == [old_uid]
    st = read_state(staged.job.ledger)
    assert [a.number for a in st.attempts] == [1, 2] and st.in_flight is not None
    assert st.in_flight.starting["activeDeadlineSeconds"] == BUDGET - 121
    assert st.in_flight.container_id == job["metadata"]["uid"]


def test_a_resubmit_while_the_last_attempt_is_unrecorded_is_refused(
    staged: Staged, server: ApiServer, capsys: Any
) -> None:
    """A second submit while attempt 1's end is not recorded (its Job still running) is
    refused before anything is sent, naming the ledger and `runner job status`/`wait`; through
    the CLI, exit 4 with the same words. Rendering it is refused the same way."""
    staged.submit()
    sent = len(server.writes())
    with pytest.raises(JobBusy) as refused:
        staged.submit()
    text = str(refused.value)
    assert "attempt 1 was submitted to Kubernetes" in text and str(staged.job.ledger) in text
    assert f"runner job status {staged.job_id}" in text and "runner job wait" in text
    assert len(server.writes()) == sent
    assert len(read_state(staged.job.ledger).attempts) == 1
    common = ["--state-dir", str(staged.state), "--allow-unsigned"]
    k8s = ["--to", "kubernetes", "--namespace", NS, "--kubeconfig", str(staged.kubeconfig)]
    capsys.readouterr()
    assert dispatch(["cluster", "submit", str(staged.contract), *k8s, *common]) == 4
    assert "runner job status" in capsys.readouterr().err
    render = ["cluster", "render", str(staged.contract), "--to", "kubernetes", *common]
    assert dispatch(render) == 4
    assert len(server.writes()) == sent


def test_a_job_with_its_budget_spent_is_refused_naming_the_ledger(
    staged: Staged, server: ApiServer, virtual_clock: VirtualClock
) -> None:
    """An attempt that ran past the whole budget (the API's times say 2000 s, within the
    wall time) leaves nothing: the resubmit is refused (resource_exhausted) naming the ledger
    and the seconds used, and nothing is sent."""
    out = staged.submit()
    t0 = virtual_clock.now()
    server.add_pod(NS, out["name"], pod_status(iso(t0), iso(t0), iso(t0 + timedelta(seconds=2000))))
    virtual_clock.advance(3000)
    ended(server, out["name"])
    staged.status()
    sent = len(server.writes())
    with pytest.raises(ResourceExhausted) as refused:
        staged.submit()
    text = str(refused.value)
    assert "has used 2001.0 s of its 900.0 s budget" in text and str(staged.job.ledger) in text
    assert len(server.writes()) == sent


def test_a_job_the_server_refused_is_recorded_not_created(
    staged: Staged, server: ApiServer
) -> None:
    """A Job the API server refuses (422) is attempt 1, finished at 0 s (``not-created``):
    the next submit is not refused for it and gets the whole budget."""
    server.fail_with[("POST", "Job")] = (422, "spec.template: Invalid value")
    with pytest.raises(InfrastructureError, match="422"):
        staged.submit()
    (fin,) = staged.finished()
    assert (fin["how"], fin["seconds"]) == ("not-created", 0.0)
    del server.fail_with[("POST", "Job")]
    again = staged.submit()
    assert again["attempt"] == 2 and again["activeDeadlineSeconds"] == BUDGET


def test_a_job_gone_before_its_end_was_seen_is_charged_to_its_deadline(
    staged: Staged, server: ApiServer, virtual_clock: VirtualClock
) -> None:
    """The Job and its pods deleted behind the runner's back: status() finds no Job, and the
    attempt is charged the wall time since its submit, at most activeDeadlineSeconds + the
    pod's grace (5 s): 905 s after 5000 s."""
    out = staged.submit()
    del server.objects[("Job", NS, out["name"])]
    virtual_clock.advance(5000)
    with pytest.raises(JobNotFound, match="charged 905 s"):
        staged.status()
    (fin,) = staged.finished()
    assert fin["seconds"] == 905.0 and fin["how"] == "kubernetes-vanished"
    assert (fin["startFrom"], fin["endFrom"]) == ("submitted", "observed")


def test_a_job_that_exists_unrecorded_is_refused(staged: Staged, server: ApiServer) -> None:
    """A Job of this job and contract that no attempt in the ledger names (made before the
    ledger recorded Kubernetes attempts, or by hand) refuses the submit: it may run outside the
    budget."""
    r = apply.submit(staged.contract, staged.loaded, staged.trust, namespace=NS,
                     state_dir=staged.state, kubeconfig=staged.kubeconfig, apply=False)  # fmt: skip
    job = next(m for m in r["manifests"]["items"] if m["kind"] == "Job")
    server.put(job, NS)
    with pytest.raises(JobBusy, match="is no attempt in the ledger"):
        staged.submit()
    assert read_state(staged.job.ledger).attempts == []


# ------------------------------------------------------------------ hostile times


T0 = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)


def _charge(status: dict[str, Any], observed: float = 500.0) -> attempts.Charge:
    pod = {"metadata": {"uid": "p"}, "status": status}
    return attempts.charge(submitted_at=T0, observed_at=T0 + timedelta(seconds=observed),
                           pods=[pod], job={"status": {}}, deadline=900)  # fmt: skip


def at(seconds: float) -> str:
    return iso(T0 + timedelta(seconds=seconds))


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("start", "started", "finished", "seconds", "start_from", "end_from"),
    [
        # what a kubelet writes: 100 s, one second added for the cut-down seconds
        (at(10), at(12), at(110), 101.0, "api", "api"),
        # the second added never takes the charge past the wall time (500 s)
        (at(0), at(0), at(500), 500.0, "api", "api"),
        # zero seconds claimed: charged 1 s
        (at(50), at(50), at(50), 1.0, "api", "api"),
        # negative: finishedAt before startedAt: the end is the observation, and with no end
        # the API gives, its start alone is not believed: from the submit (the wall time)
        (at(100), at(100), at(40), 500.0, "submitted", "observed"),
        # in the future (a day): a clock is off, which is not known: the more of the API's
        # own start to end and the wall time, at most the deadline and the grace (905 s)
        (at(10), at(10), at(86_400), 905.0, "api", "api"),
        # absurd: before the submit, year 9999: as far apart: the deadline and the grace
        (
            "1970-01-01T00:00:00Z",
            "1970-01-01T00:00:00Z",
            "9999-12-31T23:59:59Z",
            905.0,
            "api",
            "api",
        ),
        # a start 10 minutes before the submit (the submitting host ahead): the API's own
        # start to end (its one clock), not the 5 s from the submit to its end
        (at(-600), at(-600), at(5), 606.0, "api", "api"),
        # a start before the submit within the skew counts, clamped to the submit
        (at(-20), at(-20), at(30), 31.0, "api", "api"),
        # malformed: not RFC 3339 (no zone, a space, a number, a date alone, out of range)
        ("2026-12-01 10:00:10", "yesterday", 12345, 500.0, "submitted", "observed"),
        (at(10), "2026-12-01", "2026-12-01T10:01:99Z", 500.0, "submitted", "observed"),
        (at(10), at(10), at(20) + "\n", 500.0, "submitted", "observed"),
        (at(10), at(10), "2026-12-01T10:00:20.5+25:00", 500.0, "submitted", "observed"),
        # missing finishedAt on a terminated container: to the observation
        (at(10), at(10), _ABSENT, 500.0, "submitted", "observed"),
        # no times at all
        (None, None, None, 500.0, "submitted", "observed"),
        # a late start alone (5 s before the observation) and no end: from the submit, not 5 s
        (at(495), at(495), _ABSENT, 500.0, "submitted", "observed"),
    ],
)
def test_hostile_pod_times_never_lift_the_budget(
    start: Any, started: Any, finished: Any, seconds: float, start_from: str, end_from: str
) -> None:
    """Each time is RFC 3339 or does not count; an end before the start does not count; what
    does not count falls back to the runner's own bounds (the submit, the observation), said
    in the record; the charge is never negative and never more than the wall time (500 s).
    A time outside [submit - skew, observed + skew] says a clock is off: then the more of the
    API's own start to end and the wall time, at most the deadline and the grace (905 s)."""
    got = _charge(pod_status(start, started, finished))
    assert (got.seconds, got.start_from, got.end_from) == (seconds, start_from, end_from)
    assert 0 <= got.seconds <= (500 if got.seconds <= 500 else 905)
    if got.seconds > 500:
        assert got.why is not None and "disagree" in got.why
    if end_from == "observed":
        assert got.why and got.as_json()["because"] == got.why


@pytest.mark.hostile
def test_hostile_shapes_and_owners_are_read_as_absent(
    staged: Staged, server: ApiServer, virtual_clock: VirtualClock
) -> None:
    """A pod another Job owns (though it carries this Job's label) is not this attempt's: the
    Job's own times are used (none here: submit to observation, 300 s); a pod list that is no
    list, or pods of the wrong shapes, are no pods, never a traceback."""
    out = staged.submit()
    uid = server.objects[("Job", NS, out["name"])]["metadata"]["uid"]
    t0 = virtual_clock.now()
    pod = server.add_pod(NS, out["name"], pod_status(iso(t0), iso(t0), iso(t0)))
    pod["metadata"]["ownerReferences"] = [{"kind": "Job", "uid": "someone-else"}]
    virtual_clock.advance(300)
    ended(server, out["name"])
    got = staged.status()["recorded"]
    assert got["seconds"] == 300.0 and got["endFrom"] == "observed"
    assert got["because"].startswith("no pod of the Job")
    assert pod["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] == uid
    weird = [{"status": "x"}, {"status": {"containerStatuses": "no"}}, {"status": {"startTime":
             ["2026-12-01T10:00:00Z"], "containerStatuses": [1, None, {"state": []}]}}]  # fmt: skip
    for shape in weird:
        c = attempts.charge(submitted_at=T0, observed_at=T0 + timedelta(seconds=9), pods=[shape],
                            job=None, deadline=900)  # fmt: skip
        assert (c.seconds, c.start_from, c.end_from) == (9.0, "submitted", "observed")


@pytest.mark.hostile
def test_a_pod_list_that_is_no_list_is_no_pod(
    staged: Staged, server: ApiServer, virtual_clock: VirtualClock
) -> None:
    """The API server answers the pod list with a JSON object that has no items: no pod, the
    attempt charged from submit to observation (42 s), nothing raised."""
    out = staged.submit()
    server.answer_with[("GET", "Pod")] = {"kind": "PodList", "items": {"not": "a list"}}
    virtual_clock.advance(42)
    ended(server, out["name"])
    got = staged.status()["recorded"]
    assert got["recorded"] == "now" and got["seconds"] == 42.0


def test_runner_run_takes_a_kubernetes_attempt_in_flight_as_another_hosts(
    staged: Staged, server: ApiServer, virtual_clock: VirtualClock
) -> None:
    """What `runner run` does with a Kubernetes attempt in flight (runner/execution/takeover.py,
    unchanged): the attempt names another host (the Job), so no engine here is asked; its lease
    is the deadline plus the pod's grace, so the runner waits two of them and charges at least
    what the cluster lets the pod run (905 s), never a free attempt. Its ``image`` record is
    what `runner run` reads back."""
    from runner.core import hostid
    from runner.execution import takeover
    from runner.models.envelope import ImageRecord

    staged.submit()
    led = Ledger.open(staged.job.ledger)
    last = led.state.in_flight
    assert last is not None
    other = hostid.elsewhere(last.starting)
    assert other is not None and other.startswith("kubernetes:repro/")
    assert ImageRecord.model_validate(last.starting["image"]).reference == DIGEST_IMAGE

    class Quiet:
        def stage(self, name: str, detail: str) -> None: ...
        def running(self, elapsed: float, budget: float) -> None: ...
        def transfer(self, label: str, done: int, total: int) -> None: ...

    takeover.close(led, last, other, 120.0, staged.job_id, Quiet())
    assert sum(virtual_clock.sleeps) == pytest.approx(2 * (BUDGET + 5))
    (fin,) = staged.finished()
    assert fin["how"] == "host-lost" and fin["seconds"] >= BUDGET + 5


def test_a_gone_job_is_recorded_only_when_it_is_gone_under_the_lock_and_its_pod_ended(
    staged: Staged, server: ApiServer, virtual_clock: VirtualClock
) -> None:
    """A 404 that is not true by the time the job's lock is held (the Job was made meanwhile:
    here, the stand-in hides it from the first read) records nothing; nor does a gone Job
    whose pod still runs (deleted with --cascade=orphan). Once the pod has ended, the attempt
    is charged from its times."""
    out = staged.submit()
    before = staged.job.ledger.read_bytes()
    server.hide_once.add("Job")
    with pytest.raises(JobNotFound, match="exists again"):
        staged.status()
    assert staged.job.ledger.read_bytes() == before
    t0 = virtual_clock.now()
    pod = server.add_pod(NS, out["name"], {"phase": "Running", "startTime": iso(t0)})
    del server.objects[("Job", NS, out["name"])]
    virtual_clock.advance(50)
    with pytest.raises(JobNotFound, match="a pod of it has not ended"):
        staged.status()
    assert staged.job.ledger.read_bytes() == before
    pod["status"] = pod_status(iso(t0), iso(t0), iso(t0 + timedelta(seconds=30)))
    pod["status"]["phase"] = "Failed"
    with pytest.raises(JobNotFound, match="charged 31 s"):
        staged.status()
    (fin,) = staged.finished()
    assert (fin["seconds"], fin["how"], fin["endFrom"]) == (31.0, "kubernetes-vanished", "api")


def test_with_no_pod_left_the_jobs_own_times_count() -> None:
    """The Job there, its pods gone (a TTL or a hand deleted them): its status.startTime and
    completionTime count by the same rule (61 s); a completionTime in the future says a clock
    is off (the more of the API's own times and the wall, at most the deadline and the grace:
    905 s)."""
    job = {"status": {"startTime": at(10), "completionTime": at(70)}}
    got = attempts.charge(submitted_at=T0, observed_at=T0 + timedelta(seconds=500), pods=[],
                          job=job, deadline=900)  # fmt: skip
    assert (got.seconds, got.start_from, got.end_from) == (61.0, "api", "api")
    job["status"]["completionTime"] = at(10_000)
    got = attempts.charge(submitted_at=T0, observed_at=T0 + timedelta(seconds=500), pods=[],
                          job=job, deadline=900)  # fmt: skip
    assert (got.seconds, got.start_from, got.end_from) == (905.0, "api", "api")
    assert got.why is not None and "disagree" in got.why
