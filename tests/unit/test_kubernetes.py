"""`runner render CONTRACT --to kubernetes`: the manifests validate against the official
Kubernetes schemas of two versions (kubernetes-validate, strict: unknown fields fail), keep the
runner's own rules (runner/scheduling/kubernetes/render.py check_rules, which catches each
rule broken alone), and everything `runner run` refuses (and what a cluster cannot run yet)
is refused with exit 3 and nothing written. No cluster runs here: nothing is applied."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.cli import dispatch
from runner.planning.plan import ExecutionPlan
from runner.scheduling.kubernetes import render as kube
from runner.state.ledger import Ledger
from tests.support import write_contract

DIGEST_IMAGE = "registry.example/runner-cpu@sha256:" + "ab" * 32
VERSIONS = sorted(
    {kubernetes_validate.utils.major_minor(v) for v in kubernetes_validate.utils.all_versions()},
    key=lambda v: tuple(int(x) for x in v.split(".")),
)[-2:]
"""The two newest Kubernetes versions whose schemas the installed validator bundles."""


def render(capsys: pytest.CaptureFixture[str], contract: Path, *extra: str) -> tuple[int, str, str]:
    code = dispatch(["render", str(contract), "--to", "kubernetes", "--allow-unsigned", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def manifests_of(
    capsys: pytest.CaptureFixture[str], contract: Path, *extra: str
) -> list[dict[str, Any]]:
    code, out, err = render(capsys, contract, *extra)
    assert code == 0, err
    data = json.loads(out)
    assert data["kind"] == "List"
    items: list[dict[str, Any]] = data["items"]
    return items


def policy_file(tmp_path: Path, data: dict[str, Any]) -> str:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"acceptUnsigned": True, **data}))
    return str(path)


def validate(manifests: list[dict[str, Any]]) -> None:
    """Strict validation against each version's official schemas; raises on the first error."""
    for version in VERSIONS:
        for m in manifests:
            kubernetes_validate.validate(m, version, strict=True)


def job_of(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = (m for m in manifests if m["kind"] == "Job")
    return job


def container_of(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = job_of(manifests)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_two_schema_versions_are_checked() -> None:
    """The validator bundles at least two versions and both are used (1.36 and 1.37 with
    kubernetes-validate 1.37)."""
    assert len(VERSIONS) == 2 and VERSIONS[0] != VERSIONS[1]


def test_toy_contract_renders_valid_manifests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The toy contract's Job and NetworkPolicy pass strict schema validation for two
    versions and the runner's own rules, and carry the plan: digest, argv, caps, budget."""
    contract = write_contract(tmp_path, DIGEST_IMAGE)
    manifests = manifests_of(capsys, contract, "--state-dir", str(tmp_path / "state"))
    validate(manifests)
    assert kube.check_rules(manifests) == []
    job, c = job_of(manifests), container_of(manifests)
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 15 * 60  # the contract's whole budget
    assert c["image"] == DIGEST_IMAGE
    assert c["args"][:2] == ["python3", "/job/input/repository/evaluate.py"]
    assert c["resources"]["requests"] == c["resources"]["limits"]
    assert c["resources"]["limits"] == {"cpu": "1000m", "memory": str(512 * 1024**2)}
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 10001
    assert "runtimeClassName" not in pod
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/job/input"]["readOnly"] is True
    assert mounts["/job/output"]["readOnly"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tmp"]["emptyDir"]["sizeLimit"] == str(256 * 1024**2)  # tmpfsMb
    assert volumes["job-folder"]["persistentVolumeClaim"]["claimName"] == "runner-jobs"
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    (policy,) = (m for m in manifests if m["kind"] == "NetworkPolicy")
    assert policy["spec"]["egress"] == [] and "Egress" in policy["spec"]["policyTypes"]


def test_gpu_contract_requests_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A contract asking for 2 GPUs, on a policy granting up to 4, gets nvidia.com/gpu: 2 as
    request and limit (whatever GPUs this machine has: the cluster schedules them), and no
    NVIDIA_VISIBLE_DEVICES=void."""
    contract = write_contract(tmp_path, DIGEST_IMAGE, environment={"gpu": 2})
    policy = policy_file(tmp_path, {"maxima": {"gpus": 4}})
    manifests = manifests_of(capsys, contract, "--policy", policy)
    validate(manifests)
    assert kube.check_rules(manifests) == []
    c = container_of(manifests)
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in c["env"]}


def test_gpus_over_policy_fall_back_or_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The policy's GPU rules apply as for `runner run`: over its maxima, a contract allowing
    a CPU fallback renders without GPUs (and says so); one that does not is refused."""
    policy = policy_file(tmp_path, {"maxima": {"gpus": 1}})
    contract = write_contract(tmp_path, DIGEST_IMAGE, environment={"gpu": 2})
    code, out, err = render(capsys, contract, "--policy", policy, "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["gpus"] == 0 and "CPU fallback" in info["gpuFallback"]
    assert "nvidia.com/gpu" not in container_of(info["manifests"]["items"])["resources"]["limits"]

    strict = tmp_path / "strict"
    strict.mkdir()

    def no_fallback(data: dict[str, Any]) -> None:
        data["computeRequirement"]["cpuFallbackAllowed"] = False

    contract = write_contract(strict, DIGEST_IMAGE, environment={"gpu": 2}, change=no_fallback)
    code, out, err = render(capsys, contract, "--policy", policy)
    assert code == 3 and out == ""
    assert "policy_violation" in err and "$.environment.gpu" in err


def test_gvisor_demanding_policy_sets_the_runtime_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A policy demanding runsc renders runtimeClassName gvisor, or the class named with
    --runtime-class; the manifests validate."""
    contract = write_contract(tmp_path, DIGEST_IMAGE)
    policy = policy_file(tmp_path, {"isolation": "runsc"})
    manifests = manifests_of(capsys, contract, "--policy", policy)
    validate(manifests)
    assert kube.check_rules(manifests) == []
    assert job_of(manifests)["spec"]["template"]["spec"]["runtimeClassName"] == "gvisor"
    manifests = manifests_of(capsys, contract, "--policy", policy, "--runtime-class", "runsc-k")
    assert job_of(manifests)["spec"]["template"]["spec"]["runtimeClassName"] == "runsc-k"


def test_budget_left_in_the_ledger_is_the_deadline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a ledger under --state-dir, activeDeadlineSeconds is the budget left (900 s less
    the 300.6 s consumed, rounded down), and the next attempt's number is the job's."""
    contract = write_contract(tmp_path, DIGEST_IMAGE)
    state = tmp_path / "state"
    code, out, _ = render(capsys, contract, "--json", "--state-dir", str(state))
    info = json.loads(out)
    assert info["budgetFrom"] == "contract"
    ledger_path = state / "jobs" / info["jobId"] / "record" / "ledger.jsonl"
    ledger_path.parent.mkdir(parents=True)
    ledger = Ledger.open(ledger_path)
    accepted = {"jobId": info["jobId"], "contractDigest": info["contractDigest"]}
    ledger.append("job.accepted", "job.accepted", {**accepted, "limitSeconds": 900})
    ledger.append("a1", "attempt.starting", {"attempt": 1, "containerName": "c1"})
    ledger.append("a1f", "attempt.finished", {"attempt": 1, "seconds": 300.6})
    code, out, err = render(capsys, contract, "--json", "--state-dir", str(state))
    assert code == 0, err
    info = json.loads(out)
    assert info["budgetFrom"] == "ledger"
    assert info["activeDeadlineSeconds"] == 599
    env = {e["name"]: e["value"] for e in container_of(info["manifests"]["items"])["env"]}
    assert env["RUNNER_ATTEMPT"] == "2"

    # In flight: the cluster would run it twice.
    ledger.append("a2", "attempt.starting", {"attempt": 2, "containerName": "c2"})
    code, out, err = render(capsys, contract, "--state-dir", str(state))
    assert code == 4 and out == "" and "in flight" in err
    # Spent: resource_exhausted, as `runner run` says of it.
    ledger.append("a2f", "attempt.finished", {"attempt": 2, "seconds": 599.9})
    code, out, err = render(capsys, contract, "--state-dir", str(state))
    assert code == 1 and out == "" and "resource_exhausted" in err
    # Finished: refused.
    ledger.append("fin", "job.finished", {"status": "failed"})
    code, out, err = render(capsys, contract, "--state-dir", str(state))
    assert code == 3 and out == "" and "already finished" in err


def test_a_job_id_of_another_contract_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ledger accepting another contract under the job id refuses the render."""
    contract = write_contract(tmp_path, DIGEST_IMAGE)
    state = tmp_path / "state"
    ledger_path = state / "jobs" / "shared-id" / "record" / "ledger.jsonl"
    ledger_path.parent.mkdir(parents=True)
    data = {"jobId": "shared-id", "contractDigest": "sha256:" + "0" * 64, "limitSeconds": 900}
    Ledger.open(ledger_path).append("job.accepted", "job.accepted", data)
    code, out, err = render(capsys, contract, "--state-dir", str(state), "--job-id", "shared-id")
    assert code == 3 and out == "" and "another contract" in err


def _egress_policy(tmp_path: Path) -> str:
    return policy_file(
        tmp_path, {"egress": {"allow": ["api.example:443"], "upstreamNetwork": "up"}}
    )


@pytest.mark.parametrize(
    ("why", "environment", "switches", "says"),
    [
        ("a tag", {"image": "runner-cpu:local"}, (), "is a tag"),
        ("a tag, unpinned allowed", {"image": "runner-cpu:local"}, ("--allow-unpinned-image",),
         "not pinned by a manifest digest"),
        ("a local image id", {"image": "sha256:" + "cd" * 32}, (),
         "not pinned by a manifest digest"),
        ("network", {"networkAccess": True}, ("--allow-network",), "environment.networkAccess"),
        ("egress", {"egress": ["api.example:443"]}, ("EGRESS",), "environment.egress"),
        ("all GPUs", {"gpu": "all"}, (), '"all"'),
        ("over the policy", {"cpus": 500}, (), "$.environment.cpus"),
    ],
)  # fmt: skip
def test_refusals_exit_3_and_write_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    why: str,
    environment: dict[str, Any],
    switches: tuple[str, ...],
    says: str,
) -> None:
    """What `runner run` refuses, and what a cluster cannot run yet, is refused with exit 3
    (policy_violation) and no manifest is written."""
    contract = write_contract(tmp_path, DIGEST_IMAGE, environment=environment)
    extra = ["--policy", _egress_policy(tmp_path)] if "EGRESS" in switches else list(switches)
    out_dir = tmp_path / "out"
    code, out, err = render(capsys, contract, "-o", str(out_dir), *extra)
    assert code == 3, (why, err)
    assert out == "" and "policy_violation" in err and says in err, (why, err)
    assert not out_dir.exists()


def test_signed_contract_renders_under_its_signed_job_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A contract signed by a trusted issuer (inputs pinned by `runner sign`) renders without
    --allow-unsigned, under its own job id; another --job-id is refused as by `runner run`."""
    contract = write_contract(tmp_path, DIGEST_IMAGE)
    keys = tmp_path / "trusted"
    assert dispatch(["keygen", "--out", str(tmp_path / "issuer")]) == 0
    assert dispatch(["trust", str(tmp_path / "issuer.pub"), "--trusted-keys", str(keys)]) == 0
    capsys.readouterr()
    assert dispatch(["sign", str(contract), "--key", str(tmp_path / "issuer.key"), "--json"]) == 0
    envelope = json.loads(capsys.readouterr().out)["envelope"]
    base = ["render", envelope, "--to", "kubernetes", "--trusted-keys", str(keys)]
    code = dispatch([*base, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    info = json.loads(out)
    validate(info["manifests"]["items"])
    assert info["jobId"].startswith("toy-checkpoint-evaluation-")
    code = dispatch([*base, "--job-id", "another"])
    out, err = capsys.readouterr()
    assert code == 3 and out == "" and "signed contract runs under" in err


def test_unsigned_contract_is_refused_without_the_switch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As `runner run`: an unsigned contract needs the host's consent."""
    contract = write_contract(tmp_path, DIGEST_IMAGE)
    code = dispatch(["render", str(contract), "--to", "kubernetes"])
    out, err = capsys.readouterr()
    assert code == 3 and out == "" and "signature_invalid" in err


def test_assets_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A contract with assets (served from this host's cache) does not render yet."""

    def with_asset(data: dict[str, Any]) -> None:
        data["assets"] = [
            {
                "id": "weights",
                "sha256": "sha256:" + "a" * 64,
                "size": 3,
                "path": "weights.bin",
                "sources": ["https://assets.example/weights.bin"],
            }
        ]

    contract = write_contract(tmp_path, DIGEST_IMAGE, change=with_asset)
    code, out, err = render(capsys, contract)
    assert code == 3 and out == "" and "$.assets" in err, err


def test_output_folder_gets_one_file_per_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-o DIR writes job.json and networkpolicy.json (what `kubectl apply -f DIR` reads) in
    the namespace given; a link planted in their place is replaced, never followed."""
    contract = write_contract(tmp_path, DIGEST_IMAGE)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (out_dir / "job.json").symlink_to(victim)
    code, out, err = render(capsys, contract, "-o", str(out_dir), "--namespace", "repro")
    assert code == 0, err
    assert "wrote" in out
    assert victim.read_text() == "keep"
    job = json.loads((out_dir / "job.json").read_text())
    policy = json.loads((out_dir / "networkpolicy.json").read_text())
    assert job["metadata"]["namespace"] == policy["metadata"]["namespace"] == "repro"
    validate([job, policy])
    assert kube.check_rules([job, policy]) == []


@pytest.mark.parametrize(
    ("option", "value"),
    [("--namespace", "Not_A_Name"), ("--claim", "../x"), ("--runtime-class", "a" * 300)],
)
def test_bad_names_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    """Names that are not Kubernetes names are refused before anything is read or written."""
    contract = write_contract(tmp_path, DIGEST_IMAGE)
    code, out, err = render(capsys, contract, option, value)
    assert code == 3 and out == "" and option in err


def test_hostile_job_ids_still_give_valid_names_and_labels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job id of 128 characters ending in '.', or of mixed case and underscores, still
    gives a valid Job name (a DNS label) and label values; ids differing only in case get
    different names."""
    contract = write_contract(tmp_path, DIGEST_IMAGE)
    names = set()
    for job_id in ("A" * 127 + ".", "Mixed_Case.id-", "mixed_case.id-"):
        manifests = manifests_of(capsys, contract, "--job-id", job_id)
        validate(manifests)
        assert kube.check_rules(manifests) == []
        job = job_of(manifests)
        name = job["metadata"]["name"]
        assert len(name) <= 63 and name == name.lower()
        assert len(job["metadata"]["labels"][kube.JOB_LABEL]) <= 63
        assert job["metadata"]["annotations"][f"{kube.PREFIX}/job-id"] == job_id
        names.add(name)
    assert len(names) == 3


# --------------------------------------------------------------------- the rules, broken


def _pod(m: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = job_of(m)["spec"]["template"]["spec"]
    return pod


def _c(m: list[dict[str, Any]]) -> dict[str, Any]:
    return container_of(m)


def _mount(m: list[dict[str, Any]], path: str) -> dict[str, Any]:
    (found,) = (x for x in _c(m)["volumeMounts"] if x["mountPath"] == path)
    return found


BREAKS: list[tuple[str, Callable[[list[dict[str, Any]]], Any], str]] = [
    ("a tag", lambda m: _c(m).update(image="registry.example/runner-cpu:1"), "not pinned"),
    ("digest and tag mix", lambda m: _c(m).update(image="x:1@sha256:abc"), "not pinned"),
    ("backoffLimit 1", lambda m: job_of(m)["spec"].update(backoffLimit=1), "backoffLimit"),
    ("no deadline", lambda m: job_of(m)["spec"].pop("activeDeadlineSeconds"), "activeDeadline"),
    ("restarts", lambda m: _pod(m).update(restartPolicy="OnFailure"), "restartPolicy"),
    ("root allowed", lambda m: (_c(m)["securityContext"].pop("runAsNonRoot"),
                                _pod(m)["securityContext"].pop("runAsNonRoot")), "runAsNonRoot"),
    ("uid 0", lambda m: _c(m)["securityContext"].update(runAsUser=0), "uid 0"),
    ("writable root", lambda m: _c(m)["securityContext"].update(readOnlyRootFilesystem=False),
     "readOnlyRootFilesystem"),
    ("escalation", lambda m: _c(m)["securityContext"].pop("allowPrivilegeEscalation"),
     "allowPrivilegeEscalation"),
    ("privileged", lambda m: _c(m)["securityContext"].update(privileged=True), "privileged"),
    ("a capability", lambda m: _c(m)["securityContext"]["capabilities"].update(add=["NET_RAW"]),
     "capabilities"),
    ("caps kept", lambda m: _c(m)["securityContext"].pop("capabilities"), "capabilities"),
    ("unconfined", lambda m: (_c(m)["securityContext"].update(
        seccompProfile={"type": "Unconfined"})), "seccompProfile"),
    ("cpu burst", lambda m: _c(m)["resources"]["requests"].update(cpu="500m"), "cpu requests"),
    ("memory burst", lambda m: _c(m)["resources"]["limits"].update(memory="2Gi"),
     "memory requests"),
    ("no limits", lambda m: _c(m)["resources"].pop("limits"), "limits"),
    ("gpu burst", lambda m: _c(m)["resources"]["limits"].update({"nvidia.com/gpu": "2"}),
     "nvidia.com/gpu"),
    ("writable input", lambda m: _mount(m, "/job/input").update(readOnly=False), "/job/input"),
    ("no input", lambda m: _c(m).update(volumeMounts=[
        x for x in _c(m)["volumeMounts"] if x["mountPath"] != "/job/input"]), "/job/input"),
    ("writable execution", lambda m: _mount(m, "/job/execution").pop("readOnly"),
     "/job/execution"),
    ("unbounded /tmp", lambda m: next(v for v in _pod(m)["volumes"] if v["name"] == "tmp")[
        "emptyDir"].pop("sizeLimit"), "/tmp"),
    ("token", lambda m: _pod(m).update(automountServiceAccountToken=True), "ServiceAccount"),
    ("host network", lambda m: _pod(m).update(hostNetwork=True), "hostNetwork"),
    ("hostPath", lambda m: _pod(m)["volumes"].append(
        {"name": "h", "hostPath": {"path": "/"}}), "hostPath"),
    ("sidecar", lambda m: _pod(m).setdefault("initContainers", []).append(
        {**copy.deepcopy(_c(m)), "name": "init", "image": "busybox"}), "'init'"),
    ("no job label", lambda m: job_of(m)["metadata"]["labels"].pop(kube.JOB_LABEL), "label"),
    ("egress allowed", lambda m: m[1]["spec"].update(egress=[{}]), "allows some egress"),
    ("no Egress type", lambda m: m[1]["spec"].update(policyTypes=["Ingress"]), "Egress"),
    ("selects others", lambda m: m[1]["spec"]["podSelector"].update(
        matchLabels={kube.JOB_LABEL: "other"}), "podSelector"),
    ("other namespace", lambda m: m[1]["metadata"].update(namespace="elsewhere"), "namespace"),
    ("no policy", lambda m: m.pop(1), "NetworkPolicies"),
    ("two jobs", lambda m: m.append(copy.deepcopy(m[0])), "2 Jobs"),
]  # fmt: skip


def _plan(folder: Path, environment: dict[str, Any] | None = None) -> ExecutionPlan:
    """The plan `runner render` renders for the toy contract (with ``environment``)."""
    from datetime import UTC, datetime

    from runner.contract import load_contract
    from runner.contract.load import Trust
    from runner.planning import plan, policy

    contract_path = write_contract(folder, DIGEST_IMAGE, environment=environment)
    contract = load_contract(contract_path, Trust(keys=[]))
    rules = policy.HostPolicy(acceptUnsigned=True).resolved()
    policy.check(contract, rules, datetime.now(UTC))
    return plan.build(contract, rules, job_id="good", host_uid=0, host_gid=0)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Manifests rendered for a GPU contract (so every rule has something to break)."""
    return kube.render(_plan(tmp_path_factory.mktemp("good"), {"gpu": 1}), deadline=60)


def test_the_unbroken_manifests_keep_every_rule(good: list[dict[str, Any]]) -> None:
    """The baseline the breaks start from is valid and rule-abiding."""
    validate(good)
    assert kube.check_rules(good) == []


@pytest.mark.parametrize(("why", "breaks", "says"), BREAKS, ids=[b[0] for b in BREAKS])
def test_each_broken_rule_is_caught(
    good: list[dict[str, Any]], why: str, breaks: Callable[[list[dict[str, Any]]], Any], says: str
) -> None:
    """Each rule broken alone is reported by check_rules, naming what broke."""
    manifests = copy.deepcopy(good)
    breaks(manifests)
    found = kube.check_rules(manifests)
    assert found, why
    assert any(says in line for line in found), (why, found)


def test_render_refuses_to_hand_out_broken_manifests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renderer checks its own output: a rule broken (here: the check sees the Job
    without its backoffLimit) is an infrastructure error, and no manifest is returned."""
    from runner.core.errors import InfrastructureError

    real = kube.check_rules

    def without_backoff(manifests: list[dict[str, Any]]) -> list[str]:
        broken = copy.deepcopy(manifests)
        broken[0]["spec"].pop("backoffLimit")
        return real(broken)

    monkeypatch.setattr(kube, "check_rules", without_backoff)
    with pytest.raises(InfrastructureError, match="backoffLimit"):
        kube.render(_plan(tmp_path), deadline=60)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.fixed_dictionaries(
            {"kind": st.sampled_from(["Job", "NetworkPolicy", "Pod"])},
            optional={"spec": JSON, "metadata": JSON},
        ),
        max_size=3,
    )
)
def test_check_rules_reads_any_shape_without_crashing(manifests: list[dict[str, Any]]) -> None:
    """Manifests of any JSON shape (a hand-edited file) get violations, never an exception."""
    found = kube.check_rules(manifests)
    assert isinstance(found, list)
    assert found  # none of these is a Job and a NetworkPolicy keeping every rule


@given(st.data())
@settings(max_examples=100, deadline=None)
def test_check_rules_survives_any_field_replaced(
    good: list[dict[str, Any]], data: st.DataObject
) -> None:
    """Any one field of valid manifests replaced by any JSON value: violations or none, but
    never an exception."""
    manifests = copy.deepcopy(good)
    node: Any = manifests
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        key = data.draw(st.sampled_from(keys))
        child = node[key]
        if not isinstance(child, dict | list) or not child or data.draw(st.booleans()):
            node[key] = data.draw(JSON)
            break
        node = child
    assert isinstance(kube.check_rules(manifests), list)
