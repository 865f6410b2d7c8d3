"""Hostile review, round 17: the Kubernetes path (runner/scheduling/kubernetes/). Each test
failed before its fix; against the stand-in API server (tests/support/kubeapi.py) on the
virtual clock, with the fixtures of tests/unit/test_kubebudget.py."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from runner.cli import dispatch
from runner.core import clock
from runner.core.errors import InfrastructureError
from runner.scheduling.kubernetes import apply
from runner.state.ledger import read_state
from tests.support.clock import VirtualClock
from tests.support.kubeapi import ApiServer
from tests.unit import test_kubebudget as kube
from tests.unit.test_kubebudget import BUDGET, NS, Staged, ended, iso, pod_status

# The budget tests' fixtures: the virtual clock on a whole second, the stand-in API server, a
# kubeconfig naming it and a staged job.
virtual_clock, server, kubeconfig, staged = (
    kube.virtual_clock, kube.server, kube.kubeconfig, kube.staged
)  # fmt: skip

pytestmark = pytest.mark.hostile


def _observe_from(staged: Staged, when: Any) -> dict[str, Any]:
    """`runner job status` on another host, whose clock reads ``when``."""
    with clock.use(VirtualClock(when)):
        got = apply.status(staged.job_id, namespace=NS, kubeconfig=staged.kubeconfig,
                           state_dir=staged.state)  # fmt: skip
    return dict(got["recorded"])


def test_an_observer_behind_the_submitter_never_charges_less_than_the_pod_ran(
    staged: Staged, server: ApiServer, virtual_clock: VirtualClock
) -> None:
    """Submitted from a host 10 minutes ahead of the API server and of the host that
    observes the end; the pod runs 500 s by the API server's honest times. Each attempt was
    charged 0 s (the observation, behind the submit, was clamped up to it), so three attempts
    ran 1,500 s of a 900 s budget with nothing consumed. Now each is charged its 501 s from
    the API server's own start and end (502 s from the pod's start), and the record says the
    clocks disagree."""
    skew = timedelta(seconds=600)
    out = staged.submit()
    real = virtual_clock.now() - skew  # what the API server and the observer read
    server.add_pod(NS, out["name"], pod_status(iso(real + timedelta(seconds=2)),
                                               iso(real + timedelta(seconds=3)),
                                               iso(real + timedelta(seconds=503))))  # fmt: skip
    ended(server, out["name"])
    rec = _observe_from(staged, real + timedelta(seconds=520))
    assert rec["recorded"] == "now"
    assert rec["seconds"] == 502.0 and "disagree" in rec["because"]
    assert read_state(staged.job.ledger).consumed == 502.0


def test_a_small_skew_costs_budget_never_lends_it(
    staged: Staged, server: ApiServer, virtual_clock: VirtualClock
) -> None:
    """The submitter 100 s ahead: the pod's start fell before the window and was dropped, its
    end counted from the submitting host's time: 203 s charged for 301 s run. Now 301 s."""
    out = staged.submit()
    real = virtual_clock.now() - timedelta(seconds=100)
    server.add_pod(NS, out["name"], pod_status(iso(real + timedelta(seconds=2)),
                                               iso(real + timedelta(seconds=3)),
                                               iso(real + timedelta(seconds=303))))  # fmt: skip
    ended(server, out["name"])
    rec = _observe_from(staged, real + timedelta(seconds=400))
    assert rec["seconds"] >= 301.0


def test_a_create_answered_504_stays_in_flight_and_its_late_job_is_charged(
    staged: Staged, server: ApiServer, virtual_clock: VirtualClock
) -> None:
    """A 504 to the Job's create (Kubernetes' "request did not complete within requested
    timeout": the create may still land) with nothing there when read right after: it was
    recorded finished at 0 s (not-created), the Job made a moment later ran its whole
    deadline uncharged, and a resubmit got the whole budget again. Now the attempt stays in
    flight, the hint names `runner job status`, and the late Job is charged to it."""
    server.fail_with[("POST", "Job")] = (504, "Timeout: request did not complete")
    with pytest.raises(InfrastructureError) as raised:
        staged.submit()
    assert "runner job status" in str(raised.value)
    (attempt,) = read_state(staged.job.ledger).attempts
    assert attempt.finished is None
    body = next(r.body for r in server.requests if r.method == "POST" and r.collection == "jobs")
    del server.fail_with[("POST", "Job")]
    made = server.put(body, NS)  # the create lands after the read
    t0 = virtual_clock.now()
    server.add_pod(NS, made["metadata"]["name"],
                   pod_status(iso(t0), iso(t0), iso(t0 + timedelta(seconds=BUDGET))))  # fmt: skip
    virtual_clock.advance(BUDGET + 30)
    ended(server, made["metadata"]["name"], "Failed", "DeadlineExceeded")
    rec = staged.status()["recorded"]
    assert rec["recorded"] == "now" and rec["seconds"] >= BUDGET
    assert read_state(staged.job.ledger).budget().remaining < 1


def test_a_create_refused_422_is_still_not_created(staged: Staged, server: ApiServer) -> None:
    """A 4xx says the Job was not made: still recorded at 0 s, so the 504 rule above does not
    hold every refusal in flight."""
    server.fail_with[("POST", "Job")] = (422, "spec.template: Invalid value")
    with pytest.raises(InfrastructureError):
        staged.submit()
    (attempt,) = read_state(staged.job.ledger).attempts
    assert attempt.finished is not None and attempt.finished["how"] == "not-created"


def test_an_api_servers_answer_is_capped_and_its_uid_checked(
    staged: Staged, server: ApiServer
) -> None:
    """A create answered with a 64 MB uid: the answer was read whole and the uid appended to
    the ledger (64 MB more, read by every later command). Now answers are read to 4 MiB, and
    a uid that is not one (a newline in it, here) is never recorded: the Job's own, read
    back, is."""
    before = staged.job.ledger.stat().st_size
    server.answer_with[("POST", "Job")] = {"kind": "Job", "metadata": {"uid": "u" * 6_000_000}}
    with pytest.raises(InfrastructureError, match="more than 4 MiB"):
        staged.submit()
    assert staged.job.ledger.stat().st_size - before < 10_000
    del server.answer_with[("POST", "Job")]
    for attempt in read_state(staged.job.ledger).attempts:
        assert attempt.container_id is None or len(attempt.container_id) <= 64
    assert apply.attempts.job_uid("1b4e28ba-2fa1-11d2-883f-0016d3cca427\n") is None
    assert apply.attempts.job_uid("u" * 65) is None
    assert apply.attempts.job_uid("1b4e28ba-2fa1-11d2-883f-0016d3cca427")


def test_a_conditions_words_reach_the_terminal_printable(
    staged: Staged, server: ApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Job condition's message with escape sequences (a window title, a screen clear) was
    printed raw by `runner job wait`. Now printable ASCII."""
    out = staged.submit()
    server.set_status(NS, out["name"], {"conditions": [{
        "type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
        "message": "\x1b]0;owned\x07\x1b[2J\x1b[31mall good\x1b[0m"}]})  # fmt: skip
    capsys.readouterr()
    dispatch(["job", "wait", staged.job_id, "--state-dir", str(staged.state)])
    text = capsys.readouterr().out
    assert "all good" in text and "\x1b" not in text and "\x07" not in text


def test_render_says_its_manifests_are_no_attempt(
    staged: Staged, capsys: pytest.CaptureFixture[str]
) -> None:
    """`runner cluster render | kubectl apply` (the documented flow) handed out the whole
    budget left each time and recorded nothing, silently. Rendering still records nothing
    (it contacts no cluster), but says so, on stderr and in --json, naming `submit`."""
    args = ["cluster", "render", str(staged.contract), "--to", "kubernetes", "--state-dir",
            str(staged.state), "--allow-unsigned", "-o", "-"]  # fmt: skip
    assert dispatch(args) == 0
    captured = capsys.readouterr()
    assert "no attempt in the job's ledger" in captured.err and "cluster submit" in captured.err
    assert dispatch([*args, "--json"]) == 0
    assert "cluster submit" in json.loads(capsys.readouterr().out)["ledger"]


def test_the_pod_carries_the_deadline_too(staged: Staged) -> None:
    """Only the Job carried activeDeadlineSeconds, which its controller enforces: a pod
    orphaned from it (`kubectl delete job --cascade=orphan`) or on a node cut off from the
    API server ran on with no deadline. Now the pod's own (the kubelet's) is the Job's, and
    manifests whose pod lacks it break the rules `apply` checks."""
    from runner.scheduling.kubernetes import plan, render

    r = plan.rendered(staged.contract, staged.loaded, staged.trust, state_dir=staged.state)
    job = next(m for m in r.manifests if m["kind"] == "Job")
    assert job["spec"]["template"]["spec"]["activeDeadlineSeconds"] == r.deadline
    assert render.check_rules(r.manifests) == []
    del job["spec"]["template"]["spec"]["activeDeadlineSeconds"]
    assert any("pod's activeDeadlineSeconds" in b for b in render.check_rules(r.manifests))


def test_decoy_pods_carrying_the_label_do_not_hide_the_jobs_own(
    staged: Staged, server: ApiServer, virtual_clock: VirtualClock
) -> None:
    """Eight pods another owner made with the Job's controller-uid label came first in the
    list: the cut to eight pods dropped the Job's own pod before the owner check, so its end
    was charged as gone (from the submit). Now the Job's own pods are picked first."""
    out = staged.submit()
    uid = server.objects[("Job", NS, out["name"])]["metadata"]["uid"]
    t0 = virtual_clock.now()
    for n in range(8):
        decoy = server.add_pod(NS, out["name"], pod_status(iso(t0), iso(t0), iso(t0)))
        decoy["metadata"]["name"] = f"decoy-{n}"
        decoy["metadata"]["ownerReferences"] = [{"kind": "Job", "uid": "someone-else"}]
    server.add_pod(NS, out["name"], pod_status(iso(t0 + timedelta(seconds=10)),
                                               iso(t0 + timedelta(seconds=10)),
                                               iso(t0 + timedelta(seconds=110))))  # fmt: skip
    virtual_clock.advance(300)
    ended(server, out["name"])
    rec = staged.status()["recorded"]
    assert (rec["seconds"], rec["startFrom"], rec["endFrom"]) == (101.0, "api", "api"), uid


def test_an_error_answer_is_capped_too(staged: Staged, server: ApiServer) -> None:
    """The 4 MiB cap held for answers the runner read, not for errors: the official client
    reads an error's body whole before it raises (a 500 with 40 MB went into memory whole).
    Now every answer, an error's too, is read to 4 MiB."""
    out = staged.submit()
    server.fail_with[("GET", "Job")] = (500, "x" * 6_000_000)
    with pytest.raises(InfrastructureError, match="more than 4 MiB"):
        apply.status(staged.job_id, namespace=NS, kubeconfig=staged.kubeconfig)
    del server.fail_with[("GET", "Job")]
    assert (
        apply.status(staged.job_id, namespace=NS, kubeconfig=staged.kubeconfig)["name"]
        == (out["name"])
    )


def test_a_create_answered_with_what_cannot_be_read_stays_in_flight(
    staged: Staged, server: ApiServer
) -> None:
    """A 2xx to the Job's create whose body is no JSON object: the Job was made, yet the
    attempt was recorded finished at 0 s (not-created) when the read right after found none.
    An answer that cannot be read says nothing of what was done: the attempt stays in flight."""
    server.answer_with[("POST", "Job")] = ["not", "an", "object"]
    with pytest.raises(InfrastructureError, match="no JSON object") as raised:
        staged.submit()
    assert "runner job status" in str(raised.value)
    (attempt,) = read_state(staged.job.ledger).attempts
    assert attempt.finished is None


def test_an_api_server_trickling_its_answer_is_given_up_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An API server that sends its answer's head, then a byte every half second: the
    client's timeout bounds each receive only, so `runner job status` waited as long as the
    server kept trickling. Now a request and its answer must be done within ANSWER_SECONDS
    (2 s here), else the server did not answer."""
    import time
    import uuid
    from types import SimpleNamespace

    from runner.scheduling.kubernetes import render
    from tests.support.kubeapi import write_kubeconfig
    from tests.unit.test_hostile_review_round16 import _registry_server, _trickle

    def trickle(h: Any) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", "100000")
        h.end_headers()
        _trickle(h, b" ", 60, 0.5)

    path = f"/apis/batch/v1/namespaces/{NS}/jobs/{render.object_name('job-1')}"
    server = _registry_server({path: trickle})
    monkeypatch.setattr(apply, "ANSWER_SECONDS", 2.0)
    port = server.server_address[1]
    stand_in = SimpleNamespace(url=f"http://127.0.0.1:{port}", token=uuid.uuid4().hex)
    config = write_kubeconfig(tmp_path / "kubeconfig", {"only": stand_in}, "only")  # type: ignore[dict-item]
    started = time.monotonic()
    try:
        with pytest.raises(InfrastructureError, match="did not answer"):
            apply.status("job-1", namespace=NS, kubeconfig=config)
    finally:
        server.shutdown()
        server.server_close()
    assert time.monotonic() - started < 15
