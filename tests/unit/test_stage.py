"""`runner stage CONTRACT`: the job folder laid out as `runner run` lays it out before it
creates a container, with no engine at all (DOCKER_HOST points nowhere), inputs checked
against the digests the contract binds, hostile inputs refused, and then `runner run` on the
same job folder runs the staged job (the real engine).

The tests that need the engine are in tests/integration/test_stage.py."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from runner.contract import with_digest
from runner.staging import jobdir as staging
from runner.state.jobdir import JobDir
from tests.support import (
    FAKE_IMAGE_ID,
    run_cli,
    toy_input_digests,
    write_contract,
)

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
"""Any engine call fails: what stages with this needs none."""


def bound_contract(folder: Path, image: str) -> Path:
    """The toy contract in ``folder`` with its inputs, bound to their digests."""
    digests = toy_input_digests()

    def bind(data: dict[str, Any]) -> None:
        data["paper"]["digest"] = digests["paper"]
        data["repository"]["digest"] = digests["repository"]

    return write_contract(folder, image, change=bind)


def stage(contract: Path, state: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    proc = run_cli(
        "stage", str(contract), "--state-dir", str(state), "--allow-unsigned", "--json", *extra,
        env=NO_ENGINE,
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def ledger_events(job_dir: Path) -> list[str]:
    lines = (job_dir / "record" / "ledger.jsonl").read_text().splitlines()
    return [json.loads(line)["type"] for line in lines]


def test_stage_lays_out_the_job_folder_with_no_engine(tmp_path: Path) -> None:
    """Exit 0 with {jobId, jobDir, files, bytes}; input/ holds every file the manifest lists
    with the sha256 it lists, and re-checks as staged; runtime-budget.json and
    compute-decision.json say attempt 1 with the whole budget; the working copy and the
    writable folders (the job user's when staged as root) are there; the ledger has only
    job.accepted."""
    contract = bound_contract(tmp_path, FAKE_IMAGE_ID)
    code, info, err = stage(contract, tmp_path / "state")
    assert code == 0, err
    assert {"jobId", "jobDir", "files", "bytes"} <= set(info)
    job = JobDir(Path(info["jobDir"]))
    assert job.root == tmp_path / "state" / "jobs" / info["jobId"]
    manifest = json.loads((job.execution / "input-manifest.json").read_text())
    listed = {f["path"]: f for f in manifest["files"]}
    assert {"paper.md", "task.json", "result.schema.json", "compute-decision.json"} <= set(listed)
    assert info["files"] == len(listed)
    assert info["bytes"] == sum(f["size"] for f in listed.values())
    for rel, f in listed.items():
        data = (job.input / rel).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"], rel
    assert [i["digest"] for i in manifest["inputs"]] == list(toy_input_digests().values())
    assert staging.recheck_inputs(job).unchanged is True
    budget = json.loads(job.budget_file.read_text())
    assert budget["remainingSeconds"] == budget["limitSeconds"] == 15 * 60
    decision = json.loads((job.input / "compute-decision.json").read_text())
    assert (decision["attempt"], decision["accelerator"], decision["gpus"]) == (1, "cpu", [])
    assert (job.workspace / "repository" / "evaluate.py").is_file()
    uid = 10001 if os.geteuid() == 0 else os.getuid()
    for folder in job.writable:
        assert folder.stat().st_uid == uid, folder
    assert (job.output / "logs").is_dir()  # the folder of the job's stdout and stderr
    assert ledger_events(job.root) == ["job.accepted"]
    assert not job.envelope.exists() and not (job.record / "attempts").exists()


def test_a_gpu_job_is_staged_with_no_gpu_handed_out(tmp_path: Path) -> None:
    """A contract asking for 2 GPUs (the policy grants 4) stages on a machine without any:
    its compute decision says gpu with no GPU named (the scheduler picks them)."""
    contract = write_contract(tmp_path, FAKE_IMAGE_ID, environment={"gpu": 2})
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"maxima": {"gpus": 4}}))
    code, info, err = stage(contract, tmp_path / "state", "--policy", str(policy))
    assert code == 0, err
    decision = json.loads((Path(info["jobDir"]) / "input" / "compute-decision.json").read_text())
    assert (decision["accelerator"], decision["gpus"], decision["cpuFallback"]) == (
        "gpu",
        [],
        None,
    )


def test_staging_again_accepts_once_and_keeps_the_job(tmp_path: Path) -> None:
    """A second stage of the same contract is the same layout; the ledger keeps one event."""
    contract = bound_contract(tmp_path, FAKE_IMAGE_ID)
    first = stage(contract, tmp_path / "state")
    again = stage(contract, tmp_path / "state")
    assert first[0] == again[0] == 0, again[2]
    assert first[1]["acceptedNow"] is True and again[1]["acceptedNow"] is False
    assert again[1]["files"] == first[1]["files"] and again[1]["bytes"] == first[1]["bytes"]
    assert ledger_events(Path(again[1]["jobDir"])) == ["job.accepted"]


def test_an_input_that_is_not_the_bound_one_is_refused(tmp_path: Path) -> None:
    """The paper changed after the contract bound it: input_digest_mismatch, exit 3, naming
    the field; no compute decision is written."""
    contract = bound_contract(tmp_path, FAKE_IMAGE_ID)
    (tmp_path / "paper.md").write_text("not the paper the contract binds\n")
    code, info, _ = stage(contract, tmp_path / "state")
    assert code == 3
    assert info["category"] == "input_digest_mismatch" and "$.paper" in info["error"]
    assert not list((tmp_path / "state").glob("jobs/*/input/compute-decision.json"))


def test_hostile_inputs_are_refused(tmp_path: Path) -> None:
    """A FIFO in the repository (a read would hang), and a repository that is a link to a
    folder outside the contract's, are refused (exit 3) as `runner run` refuses them."""
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    contract = write_contract(fifo, FAKE_IMAGE_ID)
    os.mkfifo(fifo / "repository" / "pipe")
    code, info, _ = stage(contract, tmp_path / "state")
    assert code == 3 and info["category"] == "invalid_contract"
    assert "pipe" in info["error"] and "FIFO" in info["error"].upper()

    linked = tmp_path / "linked"
    linked.mkdir()
    contract = write_contract(linked, FAKE_IMAGE_ID)
    outside = tmp_path / "outside"
    (linked / "repository").rename(outside)
    (linked / "repository").symlink_to(outside)
    code, info, _ = stage(contract, tmp_path / "state2")
    assert code == 3 and info["category"] == "invalid_contract"
    assert "repository" in info["error"]
    assert not list((tmp_path / "state2").glob("jobs/*/input/repository/*"))


def test_a_job_id_of_another_contract_is_refused(tmp_path: Path) -> None:
    """--job-id names a job this host accepted for another contract: refused, exit 3, and
    that job's folder is left as it was."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    first = bound_contract(a, FAKE_IMAGE_ID)
    second = write_contract(b, FAKE_IMAGE_ID, change=lambda d: d.update(name="other-task"))
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"allowJobIdOverride": True}))
    extra = ("--job-id", "shared", "--policy", str(policy))
    code, info, err = stage(first, tmp_path / "state", *extra)
    assert code == 0, err
    before = (Path(info["jobDir"]) / "record" / "ledger.jsonl").read_bytes()
    code, refused, _ = stage(second, tmp_path / "state", *extra)
    assert code == 3 and "belongs to another contract" in refused["error"]
    assert (Path(info["jobDir"]) / "record" / "ledger.jsonl").read_bytes() == before


def test_an_unsigned_contract_needs_the_switch(tmp_path: Path) -> None:
    """As `runner run`: without --allow-unsigned (or a trusting policy) an unsigned contract
    is refused, and no job folder is made."""
    data = json.loads(bound_contract(tmp_path, FAKE_IMAGE_ID).read_text())
    (tmp_path / "task.json").write_text(json.dumps(with_digest(data)))
    proc = run_cli("stage", str(tmp_path / "task.json"), "--state-dir", str(tmp_path / "s"),
                   env=NO_ENGINE)  # fmt: skip
    assert proc.returncode == 3 and "signature" in proc.stderr.lower()
    assert not (tmp_path / "s" / "jobs").exists()


def test_an_agent_job_is_staged_with_the_hosts_prompt(tmp_path: Path) -> None:
    """An agent-planned contract that names no prompt of its own: `runner stage` stages the
    host's prompt as `runner run` does (input/agent-prompt.md, in the manifest and the
    listing), which it had left out."""
    from runner.agents import adapters as agents
    from tests.unit.test_agents import SCRIPTED, _contract

    contract = _contract(tmp_path, lambda d: d["agent"].pop("promptPath"))
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"agents": {"scripted": {**SCRIPTED, "image": FAKE_IMAGE_ID}}}))
    code, info, err = stage(contract, tmp_path / "state", "--policy", str(policy))
    assert code == 0, err
    job = JobDir(Path(info["jobDir"]))
    manifest = json.loads((job.execution / "input-manifest.json").read_text())
    listed = {f["path"] for f in manifest["files"]}
    assert agents.HOST_PROMPT_NAME in listed and "result.schema.json" in listed
    assert (job.input / agents.HOST_PROMPT_NAME).read_bytes().strip()
    assert staging.recheck_inputs(job).unchanged is True
