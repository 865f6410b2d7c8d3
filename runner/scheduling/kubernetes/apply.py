"""Long on purpose: one client's whole conversation with the API server (create, read back,
delete) and the checks around each answer stay together.

Kubernetes, applied: the manifests of :mod:`runner.scheduling.kubernetes.render` created on a
cluster with the official Python client (``kubernetes`` on PyPI, the ``[kubernetes]`` extra,
imported only inside the functions that talk to a cluster), and the Job's end read back.

The functions `runner submit --to kubernetes`, `runner wait` and `runner cancel` call::

    submit(contract_path, loaded, trust, *, namespace, state_dir, job_id=None,
           claim=..., runtime_class=..., context=None, kubeconfig=None, dry_run=False,
           apply=True, require_staged=True) -> dict
        runner.scheduling.kubernetes.plan.rendered() (the checks of `runner run`, the plan,
        the budget from the ledger, the manifests: what `runner render --to kubernetes`
        prints), then apply()
        unless ``apply`` is False; refuses (policy_violation) a job folder under
        ``state_dir`` that `runner stage` did not lay out for this contract; a submit (not a
        dry run) of a staged job is the next attempt in its ledger (attempts.py)
    apply(manifests, *, namespace, context=None, kubeconfig=None, dry_run=False) -> list[dict]
    status(job_id, *, namespace, context=None, kubeconfig=None, state_dir=None) -> dict
    wait(job_id, *, namespace, context=None, kubeconfig=None, timeout=None,
         poll_seconds=2.0, on_status=None, state_dir=None) -> dict
    delete(job_id, *, namespace, context=None, kubeconfig=None, state_dir=None) -> dict

:func:`apply` sends nothing that breaks :func:`runner.scheduling.kubernetes.render.check_rules`,
and sends the bytes that were checked: the client's serialization of each object is compared
with the manifest first. The NetworkPolicy is created before the Job, so the Job's pod never
runs without it. Both objects are read first: one that exists with this job's labels and
contract digest is reported (``exists``), not created again; one that exists with another
contract's, or that the runner did not make, is refused (``policy_violation``) before
anything is created. With ``dry_run`` each create is sent with ``dryRun=All``: the API
server checks it (admission included) and stores nothing.

:func:`status` and :func:`wait` read the Job's conditions: ``Complete`` is ``complete``;
``Failed`` is ``deadline_exceeded`` with reason DeadlineExceeded (activeDeadlineSeconds, the
budget) and ``failed`` otherwise. With ``state_dir`` they (and :func:`delete`) record the
attempt's end in the job's ledger, charged from the pod's times by the rule of
:mod:`runner.scheduling.kubernetes.attempts`; never an envelope. What the API server reports
is its word, not evidence the runner observed (no exit code or OOM flag is recorded from it);
the job's evidence is in ``output/`` on the claim.

API errors are refusals or infrastructure failures naming the object and the server's
message: unreachable server or refused credentials (``infrastructure``), an object the server
rejects (``infrastructure``), a name taken by another contract (``policy_violation``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from urllib3.exceptions import HTTPError

from runner.contract import Trust
from runner.core import clock, deadlines, untrusted
from runner.core.errors import (
    HostConfigError,
    InfrastructureError,
    JobBusy,
    JobNotFound,
    PolicyViolation,
    RunnerError,
)
from runner.planning.policy import LoadedPolicy
from runner.scheduling.kubernetes import attempts, render
from runner.scheduling.kubernetes.attempts import MAX_PODS
from runner.scheduling.kubernetes.plan import Rendered, check_staged, rendered
from runner.scheduling.kubernetes.render import Manifest
from runner.state.jobdir import JobDir, StateDir
from runner.state.ledger import Attempt, Ledger, LedgerState, read_state

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

__all__ = ["apply", "delete", "status", "submit", "wait"]

ORDER = ("NetworkPolicy", "Job")
"""The order objects are created in: the pod's NetworkPolicy exists before the pod can."""


def submit(
    contract_path: Path,
    loaded: LoadedPolicy,
    trust: Trust,
    *,
    namespace: str,
    state_dir: Path,
    job_id: str | None = None,
    claim: str = render.DEFAULT_CLAIM,
    runtime_class: str = render.DEFAULT_RUNTIME_CLASS,
    context: str | None = None,
    kubeconfig: Path | None = None,
    dry_run: bool = False,
    apply: bool = True,
    require_staged: bool = True,
) -> dict[str, Any]:
    """Render the contract's job (:func:`runner.scheduling.kubernetes.plan.rendered`) and,
    with ``apply``, create it on the cluster (:func:`apply`). What was rendered and what the
    API server answered, as JSON."""

    def again() -> Rendered:
        return rendered(
            contract_path, loaded, trust, state_dir=state_dir, job_id=job_id,
            namespace=namespace, claim=claim, runtime_class=runtime_class,
        )  # fmt: skip

    r = again()
    if require_staged:
        check_staged(r, state_dir)
    applied: list[dict[str, Any]] = []
    attempt = None
    accepted = r.state is not None and r.state.accepted is not None
    if apply and not dry_run and accepted:
        job_dir = StateDir(state_dir).job(r.plan.job_id)
        with job_dir.locked():  # the ledger as it is now, no other submit or run meanwhile
            r = again()
            applied, attempt = _as_attempt(r, job_dir, namespace, context, kubeconfig)
    elif apply:
        applied = _apply(
            r.manifests, namespace=namespace, context=context, kubeconfig=kubeconfig,
            dry_run=dry_run,
        )  # fmt: skip
    return {
        "submitted": bool(apply) and not dry_run,
        "to": "kubernetes",
        "dryRun": dry_run,
        "jobId": r.plan.job_id,
        "contractDigest": r.contract_digest,
        "name": r.name,
        "namespace": namespace,
        "context": context,
        "claim": claim,
        "activeDeadlineSeconds": r.deadline,
        "budgetFrom": "ledger" if r.state is not None and r.state.accepted else "contract",
        "applied": applied,
        "manifests": render.as_list(r.manifests),
        "notEnforced": list(render.NOT_ENFORCED),
        "attempt": attempt,
        "recorded": (
            f"attempt {attempt} in the ledger {StateDir(state_dir).job(r.plan.job_id).ledger} "
            "(its end is recorded by `runner job status`, `wait` or `cancel`); no envelope"
            if attempt is not None
            else "nothing: not submitted, or no ledger (the job was not staged)"
        ),
    }


def _as_attempt(
    r: Rendered,
    job_dir: JobDir,
    namespace: str,
    context: str | None,
    kubeconfig: Path | None,
) -> tuple[list[dict[str, Any]], int]:
    """Create ``r``'s objects as attempt n of the job's ledger (under the job's lock):
    ``attempt.starting`` before, ``attempt.started`` (the Job's uid) after. A Job of an earlier
    attempt whose end is recorded is deleted first; one the ledger does not know is refused. A
    create the server refused (or never reached) is recorded finished (0 s, ``not-created``);
    one it did not answer stays in flight, for `runner job status` to resolve."""
    job_m = next(m for m in r.manifests if m["kind"] == "Job")
    name = str(_meta(job_m, "name"))
    led = Ledger.open(job_dir.ledger)
    _clear_ended(r, led.state, job_dir, namespace, context, kubeconfig)
    n = len(led.state.attempts) + 1
    starting = attempts.starting_data(
        n, name=name, namespace=namespace, context=context, kubeconfig=kubeconfig,
        deadline=r.deadline, image=r.plan.image.reference,
    )  # fmt: skip
    led.append(f"attempt-{n}.starting", "attempt.starting", starting)
    try:
        applied = _apply(r.manifests, namespace=namespace, context=context, kubeconfig=kubeconfig)
    except _NoAnswer as exc:
        exc.hint = (
            f"the Job may exist: `runner job status {r.plan.job_id}` asks again and records "
            f"attempt {n} (its end, or that it was never made)"
        )
        raise
    except Exception as exc:
        found = _found_job(job_m, namespace, context, kubeconfig)
        # A 5xx may still make the Job after the read: not known to be never made.
        unclear = (isinstance(exc, _Refused) and exc.job_made_maybe) or (
            isinstance(exc, _Garbled) and "answered POST Job " in exc.message
        )
        if found is None and not unclear:  # never made: nothing ran, nothing is charged
            data = {"attempt": n, "exitCode": None, "oomKilled": False,
                    "classification": "infrastructure", "seconds": 0.0,
                    "how": "not-created"}  # fmt: skip
            led.append(f"attempt-{n}.finished", "attempt.finished", data)
        elif isinstance(found, str):
            attempts.record_started(led, n, found)
        if unclear and isinstance(exc, RunnerError) and not isinstance(found, str):
            exc.hint = (
                f"the server may still make the Job: `runner job status {r.plan.job_id}` asks "
                f"again and records attempt {n} (its end, or, once it is still not there, as "
                "gone)"
            )
        raise
    uid = attempts.job_uid(next((a.get("uid") for a in applied if a.get("kind") == "Job"), None))
    if uid is not None:
        attempts.record_started(led, n, uid)
    return applied, n


def _found_job(
    job_m: Manifest, namespace: str, context: str | None, kubeconfig: Path | None
) -> str | bool | None:
    """After a failed apply: the uid of this job's Job if it was made after all, None when
    there is none (or only another's), True when that cannot be told (it stays in flight)."""
    try:
        client = _client(context, kubeconfig)
        try:
            found = _read(client, "Job", str(_meta(job_m, "name")), namespace)
        finally:
            client.close()  # type: ignore[no-untyped-call]
    except InfrastructureError:
        return True
    if found is None or not _same_job(found, job_m):
        return None
    uid = attempts.job_uid(_meta(found, "uid"))
    return uid if uid is not None else True


def _clear_ended(
    r: Rendered,
    state: LedgerState,
    job_dir: JobDir,
    namespace: str,
    context: str | None,
    kubeconfig: Path | None,
) -> None:
    """Before attempt n's Job is made: the Job of that name, when there is one, is deleted if it
    is an earlier attempt's whose end is recorded (it holds the name), refused otherwise (not
    the runner's, another contract's, or this job's but no attempt in the ledger: it may run
    outside the budget)."""
    job_m = next(m for m in r.manifests if m["kind"] == "Job")
    name = str(_meta(job_m, "name"))
    client = _client(context, kubeconfig)
    try:
        found = _read(client, "Job", name, namespace)
    finally:
        client.close()  # type: ignore[no-untyped-call]
    if found is None:
        return
    _refuse_foreign(job_m, found, namespace)
    uid = attempts.job_uid(_meta(found, "uid"))
    known = attempts.find(state, namespace, name, uid)
    if known is None or known.finished is None:
        raise JobBusy(
            f"Job {namespace}/{name} of job {r.plan.job_id} exists (uid {_said(Exception(uid))}) "
            f"and is no attempt in the ledger {job_dir.ledger}: it may be running outside the "
            "job's budget",
            hint=f"delete it (`kubectl delete job {name} -n {namespace}`) once it is done with, "
            "then submit again",
        )
    delete(r.plan.job_id, namespace=namespace, context=context, kubeconfig=kubeconfig)


# --------------------------------------------------------------------------- the API


def _client(context: str | None, kubeconfig: Path | None) -> ApiClient:
    """A client for ``context`` of ``kubeconfig`` (default: $KUBECONFIG, else ~/.kube/config,
    and its current context)."""
    import yaml

    try:
        from kubernetes import config
    except ImportError as exc:
        raise HostConfigError(
            "the Kubernetes client is not installed",
            hint="pip install 'reproduction-runner[kubernetes]'",
        ) from exc
    chosen = str(kubeconfig) if kubeconfig is not None else os.environ.get("KUBECONFIG")
    try:
        # $KUBECONFIG read now (the client reads it once, when first imported); a list of
        # files separated by ':' is merged by the client as kubectl merges it.
        made: ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=chosen or None,
            context=context,
            persist_config=False,
        )
        return _capped(made)
    except (
        config.ConfigException,
        yaml.YAMLError,
        OSError,
        ValueError,
        TypeError,
        KeyError,
    ) as exc:
        where = (
            f"kubeconfig {kubeconfig}"
            if kubeconfig
            else f"$KUBECONFIG ({chosen})"
            if chosen
            else "the default kubeconfig (~/.kube/config)"
        )
        what = f" (context {context!r})" if context else ""
        raise HostConfigError(
            f"{where}{what} cannot be used: {_said(exc)}",
            hint="pass --kubeconfig FILE and --context NAME of a cluster this host may use",
        ) from None


class _AnswerTooLong(HTTPError):
    """An API server's answer past :data:`ANSWER_MAX_BYTES`."""


def _capped(client: ApiClient) -> ApiClient:
    """``client`` with every answer read to :data:`ANSWER_MAX_BYTES` at most, an error's too:
    the official client reads an error's body whole before it raises (a 40 MB one had gone
    into memory whole), through the pool's response, whose reads this bounds."""
    pool = client.rest_client.pool_manager
    urlopen = pool.urlopen

    def capped_urlopen(*args: Any, **kw: Any) -> Any:
        resp = urlopen(*args, **kw)
        read = resp.read

        def capped_read(amt: int | None = None, *more: Any, **options: Any) -> bytes:
            most = ANSWER_MAX_BYTES + 1
            data: bytes = read(most if amt is None or amt > most else amt, *more, **options)
            if len(data) > ANSWER_MAX_BYTES:
                resp.close()
                raise _AnswerTooLong(f"more than {ANSWER_MAX_BYTES >> 20} MiB")
            return data

        resp.read = capped_read  # type: ignore[method-assign]
        return resp

    pool.urlopen = capped_urlopen  # type: ignore[method-assign]
    # Each connection handed to the HeadDeadline of the call in hand (_call): the client's
    # timeout bounds each receive only, and a server sending a byte every 20 s held a call.
    pool.pool_classes_by_scheme = dict(deadlines.pool_classes())
    return client


def _said(exc: BaseException, limit: int = 300) -> str:
    """An error's text in one short line (a server's message is hostile text)."""
    text = " ".join(str(exc).split())[:limit]
    # Printable ASCII as it is; anything else (a terminal's escapes included) escaped.
    return "".join(c if c.isascii() and c.isprintable() else ascii(c)[1:-1] for c in text)


def _server_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    try:
        data = json.loads(body) if body else {}
    except (TypeError, ValueError):
        data = {}
    message = data.get("message") if isinstance(data, dict) else None
    reason = getattr(exc, "reason", None)
    return _said(Exception(message or reason or exc))


def _api(client: ApiClient, kind: str) -> Any:
    from kubernetes import client as k8s

    return k8s.BatchV1Api(client) if kind == "Job" else k8s.NetworkingV1Api(client)


def _read(client: ApiClient, kind: str, name: str, namespace: str) -> Any:
    """The object ``kind`` ``namespace/name`` as JSON, None when there is none."""
    api = _api(client, kind)
    read = api.read_namespaced_job if kind == "Job" else api.read_namespaced_network_policy
    return _call(client, f"GET {kind} {namespace}/{name}", read, name, namespace)


ANSWER_SECONDS = 60.0
"""How long one request to the API server may take, its answer read whole (each receive is
bounded at 30 s by the client; this, the whole)."""
ANSWER_MAX_BYTES = 4 * 1024 * 1024
"""The most of an API server's answer read: a Job, a NetworkPolicy or :data:`MAX_PODS` pods
are tens of KiB (a 64 MB uid in a create's answer had gone whole into the ledger)."""


def _call(client: ApiClient, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """One request of the official client, its raw answer read as JSON, at most
    :data:`ANSWER_MAX_BYTES`: None for a 404 of a read; any other failure an error naming
    ``what`` and the server's message; all of it within :data:`ANSWER_SECONDS`."""
    host = client.configuration.host
    with deadlines.HeadDeadline(ANSWER_SECONDS) as deadline:
        try:
            return _answered(host, what, fn, *args, **kw)
        except (InfrastructureError, HTTPError):
            if deadline.expired:  # the connection was shut down: what was read is cut short
                raise _NoAnswer(
                    f"the Kubernetes API server at {host} did not answer {what} whole within "
                    f"{ANSWER_SECONDS:g} s",
                    hint="check the kubeconfig's server and this host's network",
                ) from None
            raise


def _answered(host: str, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """:func:`_call`'s request and the reading of its answer."""
    from kubernetes.client.exceptions import ApiException

    try:
        answer = fn(*args, **kw, _preload_content=False, _request_timeout=30)
    except _AnswerTooLong:
        raise _too_long(host, what) from None
    except HTTPError as exc:
        raise _NoAnswer(
            f"the Kubernetes API server at {host} did not answer ({what}): {_said(exc)}",
            hint="check the kubeconfig's server and this host's network",
        ) from None
    except ApiException as exc:
        if exc.status == 404 and what.startswith(("GET ", "DELETE ")):
            return None
        message = _server_message(exc)
        if exc.status in (401, 403):
            raise InfrastructureError(
                f"the Kubernetes API server at {host} refused {what}: {exc.status} {message}",
                hint="use credentials (--kubeconfig, --context) allowed to get and create jobs "
                "and networkpolicies in the namespace",
            ) from None
        raise _Refused(exc.status or 0, host, what, message) from None
    try:
        raw = answer.read(ANSWER_MAX_BYTES + 1, decode_content=True)
    except _AnswerTooLong:
        raise _too_long(host, what) from None
    except HTTPError as exc:
        raise _NoAnswer(
            f"the Kubernetes API server at {host} broke off its answer ({what}): {_said(exc)}"
        ) from None
    finally:
        answer.release_conn()
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise _Garbled(f"the Kubernetes API server at {host} answered {what} with no JSON object")
    return data


def _too_long(host: str, what: str) -> InfrastructureError:
    return _Garbled(
        f"the Kubernetes API server at {host} answered {what} with more than "
        f"{ANSWER_MAX_BYTES >> 20} MiB (not read further)"
    )


class _Garbled(InfrastructureError):
    """The API server answered a request with what cannot be read (too long, no JSON): what
    it did with it is not known (a create may have been carried out)."""


class _NoAnswer(InfrastructureError):
    """The API server did not answer a request (what it did with it is not known)."""


class _Refused(InfrastructureError):
    """The API server answered a request with an error status (other than 401, 403)."""

    def __init__(self, status: int, host: str, what: str, message: str) -> None:
        super().__init__(
            f"the Kubernetes API server at {host} answered {what} with {status}: {message}",
            hint="the message is the server's; `kubectl get events -n NAMESPACE` may say more",
        )
        self.status = status
        self.what = what

    @property
    def job_made_maybe(self) -> bool:
        """Whether this was the Job's create, answered with what does not say it was not
        carried out: a 5xx (a 504, or a 500 with reason Timeout: "the server was unable to
        return a response in the time allotted, but may still be processing the request")."""
        return self.what.startswith("POST Job ") and not 400 <= self.status < 500


def _meta(obj: Any, *keys: str) -> Any:
    """``obj.metadata[k1]...`` of an API server's answer (hostile shapes: None where none)."""
    return untrusted.at(obj, "metadata", *keys)


def _digest_of(obj: Any) -> Any:
    """The full contract digest an object's annotation names (None without one)."""
    return untrusted.mapping(_meta(obj, "annotations")).get(f"{render.PREFIX}/contract-digest")


def _same_job(found: Any, want: Manifest) -> bool:
    """The object found has this job's labels and contract digest (the runner made it)."""
    mine, theirs = (
        untrusted.mapping(_meta(want, "labels")),
        untrusted.mapping(_meta(found, "labels")),
    )
    keys = [*render.MANAGED_BY, render.JOB_LABEL, render.CONTRACT_LABEL]
    same = all(theirs.get(k) == mine.get(k) for k in keys)
    return same and _digest_of(found) == _digest_of(want)


def apply(
    manifests: list[Manifest],
    *,
    namespace: str,
    context: str | None = None,
    kubeconfig: Path | None = None,
    dry_run: bool = False,
) -> list[dict[str, Any]]:
    """Create the NetworkPolicy, then the Job, in ``namespace``; an object already there for
    the same job and contract is reported, one of another contract (or not the runner's)
    refuses the whole apply before anything is created. One entry per object: kind, name,
    namespace, action (``created``, ``exists``, ``dry-run``), uid."""
    render.check_name("--namespace", namespace)
    broken = render.check_rules(manifests)
    if broken:
        raise PolicyViolation(
            "the manifests break the runner's rules: " + "; ".join(broken[:5]),
            hint="apply only what `runner render --to kubernetes` wrote, unchanged",
        )
    objects = sorted(manifests, key=lambda m: ORDER.index(m["kind"]))
    for m in objects:
        there = _meta(m, "namespace")
        if there is not None and there != namespace:
            raise PolicyViolation(
                f"{m['kind']} {_meta(m, 'name')} was rendered for namespace {there!r}, not "
                f"{namespace!r}",
                hint=f"render it with --namespace {namespace}",
            )
    client = _client(context, kubeconfig)
    try:
        bodies = [_body(client, m, namespace) for m in objects]
        found = []
        for m in objects:
            name = str(_meta(m, "name"))
            existing = _read(client, m["kind"], name, namespace)
            _refuse_foreign(m, existing, namespace)
            found.append(existing)
        out = []
        for m, body, existing in zip(objects, bodies, found, strict=True):
            out.append(_create(client, m, body, existing, namespace, dry_run))
        return out
    finally:
        client.close()  # type: ignore[no-untyped-call]


def _refuse_foreign(m: Manifest, existing: Any, namespace: str) -> None:
    """Refuse an object found under ``m``'s name that is not this job's (another contract's,
    or not the runner's)."""
    if existing is None or _same_job(existing, m):
        return
    name, theirs = _meta(m, "name"), _digest_of(existing)
    raise PolicyViolation(
        f"{m['kind']} {namespace}/{name} exists and is not this job's: it was made "
        f"for contract {theirs!r}" + ("" if theirs else " (or not by the runner)")
        + "; nothing was applied",
        hint=f"delete it (kubectl delete {m['kind'].lower()} {name} -n "
        f"{namespace}) if it is done with, or submit under another --job-id",
    )  # fmt: skip


_apply = apply  # submit's parameter ``apply`` hides the function's name there


def _body(client: ApiClient, m: Manifest, namespace: str) -> dict[str, Any]:
    """The object as the client sends it, checked to be the manifest (plus its namespace)."""
    from kubernetes import client as k8s

    want = {**m, "metadata": {**m["metadata"], "namespace": namespace}}
    model = (k8s.V1Job if m["kind"] == "Job" else k8s.V1NetworkPolicy).from_dict(want)
    body = client.sanitize_for_serialization(model)  # type: ignore[no-untyped-call]
    if body != want:
        raise InfrastructureError(
            f"the Kubernetes client would not send the {m['kind']} as rendered (its models "
            "drop or change a field)",
            hint="use the kubernetes client version the [kubernetes] extra names",
        )
    return dict(body)


def _create(
    client: ApiClient,
    m: Manifest,
    body: dict[str, Any],
    existing: Any,
    namespace: str,
    dry_run: bool,
) -> dict[str, Any]:
    name = str(_meta(m, "name"))
    entry: dict[str, Any] = {"kind": m["kind"], "name": name, "namespace": namespace}
    if existing is not None:
        return {**entry, "action": "exists", "uid": attempts.job_uid(_meta(existing, "uid"))}
    api = _api(client, m["kind"])
    create = (
        api.create_namespaced_job if m["kind"] == "Job" else api.create_namespaced_network_policy
    )
    extra = {"dry_run": "All"} if dry_run else {}
    try:
        made = _call(
            client, f"POST {m['kind']} {namespace}/{name}", create, namespace, body, **extra
        )
    except _Refused as exc:
        if exc.status != 409:
            raise
        # Made meanwhile (another submit of the same job): the same job's is fine.
        made = _read(client, m["kind"], name, namespace)
        if made is None or not _same_job(made, m):
            raise PolicyViolation(
                f"{m['kind']} {namespace}/{name} was made meanwhile by another contract",
                hint="submit under another --job-id",
            ) from None
        return {**entry, "action": "exists", "uid": attempts.job_uid(_meta(made, "uid"))}
    made_uid = attempts.job_uid(_meta(made, "uid"))
    return {**entry, "action": "dry-run" if dry_run else "created", "uid": made_uid}


def _conditions(job: Any) -> list[dict[str, Any]]:
    """The Job's conditions, each field as :func:`attempts.server_text` makes it (printable
    ASCII, cut): `runner job wait` and `status` print them (a message's escape sequences had
    reached the operator's terminal)."""
    found = untrusted.at(job, "status", "conditions")
    keys = ("type", "status", "reason", "message", "lastTransitionTime")
    return [
        {k: attempts.server_text(c.get(k)) for k in keys}
        for c in untrusted.array(found)[:MAX_CONDITIONS]
        if isinstance(c, dict)
    ]


def _count(value: Any) -> int:
    """A pod count of the Job's status: an int (not a bool) of at least 0, else 0."""
    return value if type(value) is int and 0 <= value < 1 << 31 else 0


MAX_CONDITIONS = 16
"""A Job's conditions looked at (a handful: Complete, Failed, Suspended, SuccessCriteriaMet,
FailureTarget); a hostile list is cut."""


def state_of(job: Any) -> tuple[str, str | None, str | None]:
    """(state, reason, message) of a Job object: ``complete``, ``deadline_exceeded``,
    ``failed``, ``running`` (a pod active) or ``pending``."""
    for c in _conditions(job):
        if c["status"] != "True":
            continue
        if c["type"] == "Complete":
            return "complete", c["reason"], c["message"]
        if c["type"] == "Failed":
            ended = "deadline_exceeded" if c["reason"] == "DeadlineExceeded" else "failed"
            return ended, c["reason"], c["message"]
    active = untrusted.at(job, "status", "active")
    running = type(active) is int and active > 0  # not a bool: JSON's true is no count
    return ("running" if running else "pending"), None, None


ENDED = frozenset({"complete", "failed", "deadline_exceeded"})


def status(
    job_id: str,
    *,
    namespace: str,
    context: str | None = None,
    kubeconfig: Path | None = None,
    state_dir: Path | None = None,
) -> dict[str, Any]:
    """The Job of ``job_id`` as the API server reports it; refuses a Job of that name that
    the runner did not make for this job id. With ``state_dir``: a Job that has ended (or is
    gone) has its attempt's end recorded in the job's ledger there (``recorded``;
    :func:`runner.scheduling.kubernetes.attempts.record_end`), once."""
    render.check_name("--namespace", namespace)
    client = _client(context, kubeconfig)
    try:
        out, _ = _look(client, job_id, namespace, state_dir)
        return out
    finally:
        client.close()  # type: ignore[no-untyped-call]


def _look(
    client: ApiClient, job_id: str, namespace: str, state_dir: Path | None
) -> tuple[dict[str, Any], Any]:
    """:func:`status` on an open client, with the Job as the server answered it."""
    name = render.object_name(job_id)
    job = _read(client, "Job", name, namespace)
    if job is None:
        said = ""
        if state_dir is not None:
            got = _observe(client, state_dir, job_id, namespace, name, None, "vanished", None)
            if got.get("recorded") == "now":
                said = (f"; its attempt {got['attempt']} is recorded in the ledger, charged "
                        f"{got['seconds']:g} s (start: {got['startFrom']}, end: "
                        f"{got['endFrom']})")  # fmt: skip
            elif got.get("why"):
                said = f"; {got['why']}"
        raise JobNotFound(
            f"no Job {namespace}/{name} (job {job_id}) on the cluster{said}",
            hint="check --namespace and --context, or submit it",
        )
    labels = untrusted.mapping(_meta(job, "labels"))
    if labels.get(render.JOB_LABEL) != render.job_label(job_id) or any(
        labels.get(k) != v for k, v in render.MANAGED_BY.items()
    ):
        raise PolicyViolation(
            f"Job {namespace}/{name} is not the runner's Job of job {job_id}",
            hint="check --namespace and --context",
        )
    state, reason, message = state_of(job)
    st = untrusted.mapping(job.get("status"))
    out = {
        "jobId": job_id,
        "name": name,
        "namespace": namespace,
        "uid": attempts.job_uid(_meta(job, "uid")),
        "contractDigest": _digest_of(job),
        "state": state,
        "ended": state in ENDED,
        "reason": reason,
        "message": message,
        "startTime": attempts.server_text(st.get("startTime"), 64),
        "completionTime": attempts.server_text(st.get("completionTime"), 64),
        **{k: _count(st.get(k)) for k in ("active", "succeeded", "failed")},
        "conditions": _conditions(job),
        "source": "the API server's Job status; no envelope is written",
    }
    if state_dir is not None and state in ENDED:
        out["recorded"] = _observe(client, state_dir, job_id, namespace, name, job, state, reason)
    return out, job


def _pods(client: ApiClient, namespace: str, uid: str) -> list[Any]:
    """The pods of the Job of ``uid`` (by the label the Job controller gives them, Kubernetes
    1.27 and later, and owned by that uid: :func:`attempts.owned_by`), at most
    :data:`MAX_PODS`, owned first (pods of another owner carrying the label had pushed the
    Job's own out of the cut)."""
    from kubernetes import client as k8s

    if attempts.job_uid(uid) is None:  # an API server's uid in a label selector: nothing else
        return []
    api = k8s.CoreV1Api(client)
    got = _call(client, f"GET pods of Job {uid} in {namespace}", api.list_namespaced_pod,
                namespace, label_selector=f"batch.kubernetes.io/controller-uid={uid}")  # fmt: skip
    return attempts.owned_by(untrusted.array(untrusted.at(got, "items")), uid)[:MAX_PODS]


def _terminated(pod: Any) -> bool:
    return all(
        isinstance(untrusted.at(c, "state", "terminated"), dict)
        for c in untrusted.array(untrusted.at(pod, "status", "containerStatuses"))
    ) and untrusted.at(pod, "status", "phase") in ("Succeeded", "Failed")


def _observe(
    client: ApiClient,
    state_dir: Path,
    job_id: str,
    namespace: str,
    name: str,
    job: Any,
    ended: str,
    reason: Any,
    pods: list[Any] | None = None,
) -> dict[str, Any]:
    """Record the end of the attempt the Job ``job`` (None: gone) ran, from its pods' times
    (``pods``, else read under the job's lock); nothing for a job with no ledger or an attempt
    recorded already, and nothing for a gone Job that is back (its submit was half done when
    it was read) or whose pod still runs."""
    job_dir = StateDir(state_dir).job(job_id)
    if not job_dir.ledger.is_file():
        return {"recorded": None, "why": f"no ledger {job_dir.ledger}"}
    uid = attempts.job_uid(_meta(job, "uid")) if job is not None else None
    seen = attempts.find(read_state(job_dir.ledger), namespace, name, uid)
    if seen is not None and seen.finished is not None:  # an onlooker's read: no lock needed
        return {"recorded": "already", "attempt": seen.number, "seconds": seen.seconds,
                "ledger": str(job_dir.ledger)}  # fmt: skip

    def pods_of(a: Attempt) -> list[Any] | str:
        if pods is not None:
            return pods
        if job is None and _read(client, "Job", name, namespace) is not None:
            return "the Job exists again (made while it was read); ask again"
        mine = a.container_id or attempts.job_uid(_meta(job, "uid"))
        found = _pods(client, namespace, mine) if isinstance(mine, str) and mine else []
        if job is None and not all(_terminated(p) for p in found):
            return "the Job is gone but a pod of it has not ended"
        return found

    return attempts.record_end(
        job_dir, namespace=namespace, name=name, job=job, pods=pods_of, ended=ended,
        reason=reason,
    )  # fmt: skip


def delete(
    job_id: str,
    *,
    namespace: str,
    context: str | None = None,
    kubeconfig: Path | None = None,
    gone_within: float = 120.0,
    state_dir: Path | None = None,
) -> dict[str, Any]:
    """Delete the runner's Job of ``job_id`` (refused, as by :func:`status`, for a Job the
    runner did not make for this job id; only that Job, by its uid), its pods with it
    (``propagationPolicy: Foreground``: the Job stays until its pods are gone), then, once the
    Job is gone, its NetworkPolicy when it carries this job's label: a pod stopping within its
    grace period is still under it. A Job not gone within ``gone_within`` seconds keeps its
    NetworkPolicy (``networkPolicy: kept``). With ``state_dir``, the attempt's end is recorded
    in the job's ledger: from its pods' times when the Job had ended, else (``cancelled``) from
    its pod's start to when the Job was seen gone. The Job's status before, with what was
    done."""
    from kubernetes import client as k8s

    before = status(job_id, namespace=namespace, context=context, kubeconfig=kubeconfig,
                    state_dir=state_dir)  # fmt: skip
    uid = before["uid"]
    if not isinstance(uid, str) or not uid:
        # Without it the precondition is no precondition: whatever Job holds the name by
        # the time the DELETE arrives would go.
        raise InfrastructureError(
            f"the API server's Job {namespace}/{before['name']} has no uid ({uid!r}); "
            "nothing was deleted",
            hint="check --namespace and --context, and the API server",
        )
    # The Job as far as a cancelled attempt's charge reads it (the pods are read below).
    job = {"metadata": {"uid": uid}, "status": {"startTime": before.get("startTime")}}
    client = _client(context, kubeconfig)
    try:
        # Its pods as they were (their start), for a cancelled attempt's charge.
        pods = _pods(client, namespace, uid) if state_dir and not before["ended"] else []
        name = before["name"]
        done = "kept: the Job was not gone in time"
        body = k8s.V1DeleteOptions(
            propagation_policy="Foreground", preconditions=k8s.V1Preconditions(uid=uid)
        )
        jobs = _api(client, "Job")
        _call(client, f"DELETE Job {namespace}/{name}", jobs.delete_namespaced_job, name,
              namespace, body=body)  # fmt: skip
        deadline = clock.monotonic() + gone_within
        while _read(client, "Job", name, namespace) is not None:
            if clock.monotonic() >= deadline:
                break
            clock.sleep(0.5)
        else:
            if state_dir is not None and not before["ended"]:
                before["recorded"] = _observe(
                    client, state_dir, job_id, namespace, name, job, "cancelled",
                    "deleted by the runner", pods,
                )  # fmt: skip
            policy = _read(client, "NetworkPolicy", name, namespace)
            labels = untrusted.mapping(_meta(policy, "labels")) if policy is not None else {}
            if policy is None:
                done = "absent"
            elif labels.get(render.JOB_LABEL) != render.job_label(job_id):
                done = "kept: not this job's"
            else:
                policies = _api(client, "NetworkPolicy")
                _call(client, f"DELETE NetworkPolicy {namespace}/{name}",
                      policies.delete_namespaced_network_policy, name, namespace)  # fmt: skip
                done = "deleted"
        if state_dir is not None and "recorded" not in before:
            before["recorded"] = {
                "recorded": None,
                "why": f"the Job was not gone in time; `runner job status {job_id}` records "
                "it once it is",
            }
    finally:
        client.close()  # type: ignore[no-untyped-call]
    return {**before, "deleted": True, "networkPolicy": done}


def wait(
    job_id: str,
    *,
    namespace: str,
    context: str | None = None,
    kubeconfig: Path | None = None,
    timeout: float | None = None,
    poll_seconds: float = 2.0,
    on_status: Callable[[dict[str, Any]], None] | None = None,
    state_dir: Path | None = None,
) -> dict[str, Any]:
    """Poll :func:`status` until the Job has ended (or ``timeout`` seconds pass: then the last
    status, with ``ended`` false); ``on_status`` sees each one whose state changed. With
    ``state_dir``, the end is recorded in the job's ledger, as by :func:`status`."""
    deadline = None if timeout is None else clock.monotonic() + timeout
    last = None
    while True:
        now = status(job_id, namespace=namespace, context=context, kubeconfig=kubeconfig,
                     state_dir=state_dir)  # fmt: skip
        if on_status is not None and now["state"] != last:
            on_status(now)
        last = now["state"]
        if now["ended"] or (deadline is not None and clock.monotonic() >= deadline):
            return now
        left = None if deadline is None else deadline - clock.monotonic()
        clock.sleep(max(poll_seconds if left is None else min(poll_seconds, left), 0.0))
