"""ExecutionPlan → Kubernetes manifests: the plan `runner run` would execute, as a ``Job`` and a
``NetworkPolicy`` for a cluster to run (`runner render CONTRACT --to kubernetes`).

Pure: values in, manifests (plain JSON data) out; no I/O, no Kubernetes client. The CLI
verifies the contract and the policy exactly as `runner run` does, builds the plan, reads the
job's ledger (for the budget left) and writes what :func:`render` returns.

What the pod runs. A pod has no Docker engine, so the cluster is the engine: the pod's one
container is the job's own image, pinned by manifest digest, with the plan's entrypoint
(stdout and stderr straight to files under /job/output), argv, user, working folder and
environment, and the plan's caps translated to the pod spec. The job folder (``input/``,
``output/``, ``workspace/`` ... as `runner run` lays it out under ``<state>/jobs/<job id>/``)
comes from a PersistentVolumeClaim, ``input/`` and ``execution/`` mounted read-only. What is
and is not enforced compared with `runner run` is :data:`NOT_ENFORCED` (the README repeats it).

Refused here (``policy_violation``), where a cluster cannot keep what `runner run` keeps:
an image pinned by a local image id only (a kubelet pulls by manifest digest), any network
(the egress allowlist's proxy is a per-job stage of `runner run`, with its log as evidence; no
cluster deployment of it exists yet), agent_planned contracts (their host secrets and model
API), ``gpu: "all"`` (a cluster needs a count) and assets (served from the runner's
content-addressed cache, which a cluster does not have).

:func:`check_rules` states the rules every rendered manifest keeps; :func:`render` checks its
own output with it, and the tests feed it manifests broken one rule at a time.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

from runner.contract import VerifiedContract
from runner.core import untrusted
from runner.core.errors import InfrastructureError, PolicyViolation
from runner.planning.plan import ExecutionPlan
from runner.state.ledger import LedgerState

__all__ = [
    "CONTRACT_LABEL", "DEFAULT_CLAIM", "DEFAULT_RUNTIME_CLASS", "JOB_LABEL", "MANAGED_BY",
    "NOT_ENFORCED", "PREFIX", "STOP_GRACE_SECONDS", "Manifest", "as_list", "check_name",
    "check_rules", "deadline_seconds", "job_label", "object_name", "refuse_unsupported", "render",
]  # fmt: skip

Manifest = dict[str, Any]

PREFIX = "reproduction-runner"
"""The prefix of the runner's own label and annotation keys (a DNS label, as Kubernetes
wants of a key prefix)."""
JOB_LABEL = f"{PREFIX}/job"
CONTRACT_LABEL = f"{PREFIX}/contract-sha256"
MANAGED_BY = {"app.kubernetes.io/managed-by": PREFIX}

DEFAULT_CLAIM = "runner-jobs"
DEFAULT_RUNTIME_CLASS = "gvisor"
STOP_GRACE_SECONDS = 5
"""SIGTERM to SIGKILL, as `runner run --stop-grace` by default."""

NOT_ENFORCED = (
    "pidsLimit: a kubelet setting (podPidsLimit) for every pod of a node, not per pod",
    "diskGb: output/ and workspace/ live on the claim; their size is the claim's (or its "
    "storage quota's), not a per-job quota watched by the runner",
    "logLimitMb: the job's stdout and stderr files grow until the claim is full",
    "budget: activeDeadlineSeconds (the budget left at submit) counts from the Job's start "
    "(scheduling and the image pull included); the attempt is charged in the ledger from the "
    "API server's pod times, only once `runner job status`, `wait` or `cancel` sees it end",
    "inputs: the job folder on the claim is used as found; its input digests are not checked "
    "again here",
    "network: the NetworkPolicy is enforced only by a network plugin that implements "
    "NetworkPolicy (Calico, Cilium ...); others ignore it silently",
    "runtime-budget.json: not updated while the cluster runs the job",
)
"""What `runner run` enforces and a rendered Job does not (said in the README as well)."""

_DIGEST_REF = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


def check_name(kind: str, value: str, *, subdomain: bool = False) -> str:
    """``value`` if it is a Kubernetes name (a DNS label, or subdomain), else a refusal."""
    pattern = _DNS_SUBDOMAIN if subdomain else _DNS_LABEL
    if not pattern.fullmatch(value):
        what = "a DNS subdomain" if subdomain else "a DNS label (at most 63 characters)"
        raise PolicyViolation(
            f"{kind} {value!r} is not {what}: lower-case letters, digits and '-'",
            hint=f"pass a {kind} such as runner-jobs",
        )
    return value


def job_label(job_id: str) -> str:
    """The job id as a label value: itself when it is one, else a readable prefix and a hash."""
    if _LABEL_VALUE.fullmatch(job_id):
        return job_id
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:12]
    head = re.sub(r"[^A-Za-z0-9]+$", "", job_id[:50])
    return f"{head}-{digest}" if head else digest


def object_name(job_id: str) -> str:
    """The Job's (and NetworkPolicy's) name: ``runner-<job id, lower case>-<hash>``, a DNS label
    whatever the id (ids differing only in case or punctuation get different names)."""
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:10]
    readable = re.sub(r"[^a-z0-9]+", "-", job_id.lower())[:40].strip("-")
    return "-".join(part for part in ("runner", readable, digest) if part)


def refuse_unsupported(contract: VerifiedContract, plan: ExecutionPlan) -> None:
    """Refuse what a cluster cannot run as `runner run` would (see the module's docstring)."""
    if plan.agent is not None:
        raise PolicyViolation(
            "$.protocol.executionMode: agent_planned contracts do not render for Kubernetes yet "
            "(their agent needs the host's secrets and its model API through the egress proxy)",
            hint="run it with `runner run` on a host with the agent's adapter",
        )
    if not _DIGEST_REF.fullmatch(plan.image.reference):
        raise PolicyViolation(
            f"$.environment.image: {plan.image.reference!r} is not pinned by a manifest digest; "
            "a cluster's nodes pull images by name@sha256:<manifest digest> (a local image id "
            "names nothing a kubelet can pull)",
            hint="push the image to a registry the cluster pulls from and pin "
            "name@sha256:<manifest digest> in the contract",
        )
    if plan.limits.network != "none":
        field = "environment.egress" if plan.egress else "environment.networkAccess"
        raise PolicyViolation(
            f"$.{field}: the job needs network ({plan.limits.network}); Kubernetes rendering "
            "covers jobs without network only (its NetworkPolicy denies all egress; the egress "
            "allowlist's proxy is not deployed on clusters yet)",
            hint="run it with `runner run`, or issue the contract without network",
        )
    if plan.limits.gpus == "all":
        raise PolicyViolation(
            '$.environment.gpu: "all" means the host\'s GPUs; a cluster schedules a number of GPUs',
            hint='issue the contract with "gpu": N',
        )
    if contract.model.fetched_assets:
        raise PolicyViolation(
            "$.assets: contracts with assets do not render for Kubernetes yet (they are served "
            "from this host's asset cache)",
            hint="run it with `runner run`",
        )


def deadline_seconds(plan: ExecutionPlan, state: LedgerState | None) -> int:
    """``activeDeadlineSeconds``: the budget left in the job's ledger, else the contract's
    whole budget (:meth:`LedgerState.left_to_schedule`), in whole seconds rounded down."""
    left = (state or LedgerState()).left_to_schedule(
        plan.job_id, plan.contract_digest, plan.limits.timeout_seconds, "the cluster"
    )
    return math.floor(left)


def _user(plan: ExecutionPlan) -> tuple[int, int]:
    uid, _, gid = plan.user.partition(":")
    return int(uid), int(gid or uid)


def _resources(plan: ExecutionPlan) -> dict[str, str]:
    lim = plan.limits
    out = {
        # Millicores, rounded down (the tighter side); the plan's least is 0.01 CPU.
        "cpu": f"{math.floor(lim.cpus * 1000)}m",
        "memory": str(lim.memory_bytes),
    }
    if isinstance(lim.gpus, int) and lim.gpus > 0:
        out["nvidia.com/gpu"] = str(lim.gpus)
    return out


MOUNTS = (
    ("/job/input", "input", True),
    ("/job/output", "output", False),
    ("/job/workspace", "workspace", False),
    ("/job/runtime-cache", "runtime-cache", False),
    ("/job/runtime-venv", "runtime-venv", False),
    ("/job/assets", "assets", True),
    ("/job/execution", "execution", True),
)
"""Where the job folder's parts are mounted in the pod (path, folder under ``jobs/<id>/``,
read-only), as `runner run` mounts them."""


def _metadata(plan: ExecutionPlan, namespace: str | None) -> dict[str, Any]:
    """The Job's (and NetworkPolicy's) name, the runner's labels and annotations, the
    namespace when given."""
    labels = {
        **MANAGED_BY,
        JOB_LABEL: job_label(plan.job_id),
        CONTRACT_LABEL: plan.contract_digest.removeprefix("sha256:")[:40],
    }
    annotations = {
        f"{PREFIX}/job-id": plan.job_id,
        f"{PREFIX}/contract-digest": plan.contract_digest,
    }
    meta: dict[str, Any] = {
        "name": object_name(plan.job_id),
        "labels": labels,
        "annotations": annotations,
    }
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _environment(plan: ExecutionPlan, attempt: int) -> list[dict[str, str]]:
    """The plan's environment, the attempt's number, and no GPU for a job without one."""
    env = {**plan.environment, "RUNNER_ATTEMPT": str(attempt)}
    if plan.limits.gpus == "none":
        # As `runner run`: a GPU-aware runtime exposes no device even if the image asks.
        env["NVIDIA_VISIBLE_DEVICES"] = "void"
    return [{"name": k, "value": v} for k, v in env.items()]


def _container(plan: ExecutionPlan, attempt: int) -> dict[str, Any]:
    """The pod's one container: the job's image, entrypoint, argv, environment and caps,
    unprivileged, with the job folder's parts and the memory-backed /tmp and /dev/shm."""
    uid, gid = _user(plan)
    resources = _resources(plan)
    base = f"jobs/{plan.job_id}"
    return {
        "name": "job",
        "image": plan.image.reference,
        "imagePullPolicy": "IfNotPresent",
        "command": plan.entrypoint,
        "args": list(plan.argv),
        "workingDir": plan.working_dir,
        "env": _environment(plan, attempt),
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": gid,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            *(
                {"name": "job-folder", "mountPath": at, "subPath": f"{base}/{sub}", "readOnly": ro}
                for at, sub, ro in MOUNTS
            ),
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 - the pod's own emptyDir
            {"name": "shm", "mountPath": "/dev/shm"},  # noqa: S108 - likewise
        ],
    }


def _pod(
    plan: ExecutionPlan, container: dict[str, Any], claim: str, runtime_class: str
) -> dict[str, Any]:
    """The pod spec: never restarted, no service-account token, no host namespaces, the job
    folder from ``claim``, gVisor's RuntimeClass when the plan runs under runsc."""
    uid, gid = _user(plan)
    lim = plan.limits
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "terminationGracePeriodSeconds": STOP_GRACE_SECONDS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": gid,
            "fsGroup": gid,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "job-folder", "persistentVolumeClaim": {"claimName": claim}},
            # tmpfs, as `runner run`'s /tmp and /dev/shm: counted in the memory cap.
            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": str(lim.tmpfs_bytes)}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": str(lim.shm_bytes)}},
        ],
    }
    if lim.runtime == "runsc":
        pod["runtimeClassName"] = runtime_class
    return pod


def _job(meta: dict[str, Any], pod: dict[str, Any], deadline: int) -> Manifest:
    """The Job: one pod, no retry, ``activeDeadlineSeconds`` the budget left on the Job and on
    its pod (the kubelet's, for a pod orphaned or cut off); its labels and annotations."""
    pod = {**pod, "activeDeadlineSeconds": deadline}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": 0,
            "completions": 1,
            "parallelism": 1,
            "activeDeadlineSeconds": deadline,
            "template": {
                "metadata": {
                    "labels": dict(meta["labels"]),
                    "annotations": dict(meta["annotations"]),
                },
                "spec": pod,
            },
        },
    }


def _network_policy(meta: dict[str, Any]) -> Manifest:
    """The Job's pods' NetworkPolicy: nothing in, nothing out."""
    labels = meta["labels"]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {**meta, "labels": dict(labels), "annotations": dict(meta["annotations"])},
        "spec": {
            # No rules under both types: nothing in, nothing out (DNS included).
            "podSelector": {"matchLabels": {JOB_LABEL: labels[JOB_LABEL]}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [],
        },
    }


def render(
    plan: ExecutionPlan,
    *,
    deadline: int,
    namespace: str | None = None,
    claim: str = DEFAULT_CLAIM,
    runtime_class: str = DEFAULT_RUNTIME_CLASS,
    attempt: int = 1,
) -> list[Manifest]:
    """The Job and its NetworkPolicy for ``plan``, checked with :func:`check_rules`."""
    meta = _metadata(plan, namespace)
    pod = _pod(plan, _container(plan, attempt), claim, runtime_class)
    manifests = [_job(meta, pod, deadline), _network_policy(meta)]
    broken = check_rules(manifests)
    if broken:  # the renderer's own bug; never hand such manifests out
        raise InfrastructureError(
            "the rendered manifests break the runner's own rules: " + "; ".join(broken)
        )
    return manifests


def as_list(manifests: list[Manifest]) -> Manifest:
    """One ``v1/List`` (what `kubectl apply -f` takes as one JSON document)."""
    return {"apiVersion": "v1", "kind": "List", "items": manifests}


# --------------------------------------------------------------------------- the rules


def _container_rules(c: Any, pod: Any, volumes: dict[str, Any]) -> list[str]:
    name = untrusted.at(c, "name")
    at = f"container {name!r}"
    out: list[str] = []
    image = untrusted.at(c, "image")
    if not isinstance(image, str) or not _DIGEST_REF.fullmatch(image):
        out.append(f"{at}: image {image!r} is not pinned by digest (name@sha256:<64 hex>)")
    sc = untrusted.mapping(untrusted.at(c, "securityContext"))
    psc = untrusted.mapping(untrusted.at(pod, "securityContext"))
    if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
        out.append(f"{at}: runAsNonRoot is not true")
    if sc.get("runAsUser", psc.get("runAsUser")) == 0:
        out.append(f"{at}: runs as uid 0")
    if sc.get("readOnlyRootFilesystem") is not True:
        out.append(f"{at}: readOnlyRootFilesystem is not true")
    if sc.get("allowPrivilegeEscalation") is not False:
        out.append(f"{at}: allowPrivilegeEscalation is not false")
    if sc.get("privileged") is True:
        out.append(f"{at}: privileged")
    caps = untrusted.mapping(sc.get("capabilities"))
    if caps.get("drop") != ["ALL"] or caps.get("add"):
        out.append(f"{at}: capabilities are not drop [ALL] with none added")
    seccomp = untrusted.at(sc, "seccompProfile", "type") or untrusted.at(
        psc, "seccompProfile", "type"
    )
    if seccomp != "RuntimeDefault":
        out.append(f"{at}: seccompProfile is not RuntimeDefault")
    requests = untrusted.mapping(untrusted.at(c, "resources", "requests"))
    limits = untrusted.mapping(untrusted.at(c, "resources", "limits"))
    for key in ("cpu", "memory"):
        if key not in limits or requests.get(key) != limits.get(key):
            out.append(f"{at}: {key} requests {requests.get(key)!r} != limits {limits.get(key)!r}")
    if requests.get("nvidia.com/gpu") != limits.get("nvidia.com/gpu"):
        out.append(f"{at}: nvidia.com/gpu requests != limits")
    mounts = {
        m["mountPath"]: m
        for m in untrusted.array(untrusted.at(c, "volumeMounts"))
        if isinstance(m, dict) and isinstance(m.get("mountPath"), str)
    }
    for path in ("/job/input", "/job/execution", "/job/assets"):
        if path in mounts and mounts[path].get("readOnly") is not True:
            out.append(f"{at}: {path} is not mounted read-only")
    if "/job/input" not in mounts:
        out.append(f"{at}: /job/input is not mounted")
    tmp = mounts.get("/tmp")  # noqa: S108 - a path in the pod
    tmp_name = untrusted.at(tmp, "name")
    size = (
        untrusted.at(volumes.get(tmp_name), "emptyDir", "sizeLimit")
        if isinstance(tmp_name, str)
        else None
    )
    if tmp is None or not size:
        out.append(f"{at}: /tmp is not a size-limited emptyDir")
    return out


def _job_rules(job: Manifest) -> list[str]:
    out: list[str] = []
    spec = untrusted.mapping(untrusted.at(job, "spec"))
    backoff = spec.get("backoffLimit")
    if type(backoff) is not int or backoff != 0:  # JSON's false (or 0.0) is not the integer 0
        out.append(f"Job: backoffLimit is {spec.get('backoffLimit')!r}, not 0")
    deadline = spec.get("activeDeadlineSeconds")
    if not isinstance(deadline, int) or isinstance(deadline, bool) or deadline < 1:
        out.append(f"Job: activeDeadlineSeconds is {deadline!r}, not a positive integer")
    pod = untrusted.mapping(untrusted.at(spec, "template", "spec"))
    if pod.get("activeDeadlineSeconds") != deadline or type(deadline) is not int:
        out.append("Job: its pod's activeDeadlineSeconds is not the Job's")
    if pod.get("restartPolicy") != "Never":
        out.append("Job: restartPolicy is not Never")
    if pod.get("automountServiceAccountToken") is not False:
        out.append("Job: automountServiceAccountToken is not false")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            out.append(f"Job: {key} is set")
    volumes = {
        v["name"]: v
        for v in untrusted.array(pod.get("volumes"))
        if isinstance(v, dict) and isinstance(v.get("name"), str)
    }
    for v in volumes.values():
        if "hostPath" in v:
            out.append(f"Job: volume {v.get('name')!r} is a hostPath")
    containers = [
        *untrusted.array(pod.get("initContainers")),
        *untrusted.array(pod.get("containers")),
    ]
    if not containers:
        out.append("Job: no container")
    for c in containers:
        out.extend(_container_rules(c, pod, volumes))
    labels = untrusted.mapping(untrusted.at(job, "metadata", "labels"))
    pod_labels = untrusted.mapping(untrusted.at(spec, "template", "metadata", "labels"))
    for key in (JOB_LABEL, CONTRACT_LABEL):
        if not labels.get(key) or pod_labels.get(key) != labels.get(key):
            out.append(f"Job: label {key} is missing on the Job or its pods")
    return out


def _policy_rules(policy: Manifest, job: Manifest | None) -> list[str]:
    out: list[str] = []
    spec = untrusted.mapping(untrusted.at(policy, "spec"))
    if "Egress" not in untrusted.array(spec.get("policyTypes")):
        out.append("NetworkPolicy: Egress is not among its policyTypes")
    if spec.get("egress"):
        out.append("NetworkPolicy: it allows some egress")
    selector = untrusted.mapping(untrusted.at(spec, "podSelector", "matchLabels"))
    pod_labels = untrusted.mapping(untrusted.at(job, "spec", "template", "metadata", "labels"))
    if not selector or any(pod_labels.get(k) != v for k, v in selector.items()):
        out.append("NetworkPolicy: its podSelector does not select the Job's pods")
    elif untrusted.at(policy, "metadata", "namespace") != untrusted.at(
        job, "metadata", "namespace"
    ):
        out.append("NetworkPolicy: not in the Job's namespace")
    return out


def check_rules(manifests: list[Manifest]) -> list[str]:
    """Each way ``manifests`` break the runner's rules for a job on Kubernetes (none: []).

    One Job and one NetworkPolicy; the Job: ``backoffLimit`` 0, a positive
    ``activeDeadlineSeconds``, ``restartPolicy`` Never, no service-account token, no host
    namespaces or hostPath; every container pinned by digest, non-root, read-only root
    filesystem, no privilege escalation, capabilities drop [ALL], seccomp RuntimeDefault,
    requests equal to limits (CPU, memory, GPUs), /job/input (and /job/execution,
    /job/assets) read-only, /tmp a size-limited emptyDir; the job's labels on the Job and its
    pods. The NetworkPolicy selects those pods and denies all egress."""
    jobs = [m for m in manifests if isinstance(m, dict) and m.get("kind") == "Job"]
    policies = [m for m in manifests if isinstance(m, dict) and m.get("kind") == "NetworkPolicy"]
    out: list[str] = []
    if len(jobs) != 1:
        out.append(f"{len(jobs)} Jobs, not one")
    if len(policies) != 1:
        out.append(f"{len(policies)} NetworkPolicies, not one")
    for job in jobs:
        out.extend(_job_rules(job))
    for policy in policies:
        out.extend(_policy_rules(policy, jobs[0] if jobs else None))
    return out
