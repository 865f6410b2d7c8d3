"""Agent-planned runs in the contract's own image (issue 26): the contract's pinned image
runs, the agent runtime is brought into it from its adapter's image (extracted once per image
id into a verified cache, mounted read-only at /opt/runner-agent), a runtime that cannot run
there is refused before the attempt, both images are on the record, and the platform's
contract (no agent.promptPath, networkAccess true) runs as issued with the host's prompt.

Pure tests use the fake backend (an image's files are a host folder); the others the real
engine, with real Claude Code against the scripted model (tests/support/model_server.py) and
the scripted runtime.

The tests that need the engine are in tests/integration/test_agent_image.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.backends.fake import FakeBackend
from runner.backends.types import ImageInfo
from runner.contract import load_contract, with_digest
from runner.core.errors import PolicyViolation
from runner.execution import agentfit, agentimage
from runner.planning import plan
from runner.planning.policy import HostPolicy
from tests.support import (
    ROOT,
    SEED,
    run_cli,
)
from tests.support.agents import (
    CLAUDE_ARGV,
    CLAUDE_RUNTIME,
    EXAMPLE,
    SCRIPTED_ARGV,
    SCRIPTED_RUNTIME,
)

# --------------------------------------------------------------------------- pure: ELF, fit


def _elf(machine: int, interp: bytes | None) -> bytes:
    """A minimal little-endian ELF64 header with one program header (PT_INTERP or PT_LOAD)."""
    phoff = 64
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 2, machine, 1, 0, phoff, 0, 0, 64, 56, 1, 0, 0, 0)
    data_off = phoff + 56
    p_type = 3 if interp is not None else 1
    size = len(interp or b"") + 1
    ph = struct.pack("<IIQQQQQQ", p_type, 4, data_off, 0, 0, size, size, 1)
    return header + ph + (interp or b"") + b"\0"


def _image_root(folder: Path, files: dict[str, bytes | str]) -> Path:
    """A host folder standing for an image's files: bytes are files (0755), a str is a link."""
    for rel, content in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            os.symlink(content, path)
        else:
            path.write_bytes(content)
            path.chmod(0o755)
    return folder


LOADER = b"/lib64/ld-linux-x86-64.so.2"


def _fake(tmp_path: Path, contract_files: dict[str, bytes | str], arch: str = "amd64") -> Any:
    fake = FakeBackend()
    runtime_id = "sha256:" + "1" * 64
    contract_id = "sha256:" + "2" * 64
    fake.images[runtime_id] = ImageInfo(runtime_id, (), ("rt:1",), "amd64", "linux", 1, ())
    fake.images[contract_id] = ImageInfo(
        contract_id, (), ("paper:1",), arch, "linux", 1, ("PATH=/usr/local/bin:/usr/bin",)
    )
    fake.roots[runtime_id] = _image_root(
        tmp_path / "runtime-image",
        {
            "usr/local/bin/claude": _elf(62, LOADER),
            "usr/local/bin/run-claude": b'#!/bin/sh\nexec "${0%/*}/claude" "$@"\n',
            "usr/local/bin/link": "claude",
        },
    )
    fake.roots[contract_id] = _image_root(tmp_path / "contract-image", contract_files)
    return fake, runtime_id, contract_id


GLIBC_IMAGE: dict[str, bytes | str] = {
    "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2": b"loader",
    "usr/lib/x86_64-linux-gnu/libc.so.6": b"glibc",
    "lib64": "usr/lib/x86_64-linux-gnu",  # a link, as merged-/usr images have
    "usr/bin/dash": b"shell",
    "bin/sh": "/usr/bin/dash",
    "usr/bin/bash": b"bash",
}


def test_elf_headers_are_read_for_machine_and_loader(tmp_path: Path) -> None:
    (tmp_path / "dyn").write_bytes(_elf(62, LOADER))
    (tmp_path / "arm").write_bytes(_elf(183, b"/lib/ld-linux-aarch64.so.1"))
    (tmp_path / "static").write_bytes(_elf(62, None))
    (tmp_path / "script").write_bytes(b"#!/usr/bin/env python3\nprint(1)\n")
    (tmp_path / "data").write_bytes(b"just data")
    needs = {n: agentfit.needs_of(tmp_path, n) for n in ("dyn", "arm", "static", "script")}
    assert needs["dyn"] == agentfit.Needs("dyn", "amd64", LOADER.decode())
    assert needs["arm"] == agentfit.Needs("arm", "arm64", "/lib/ld-linux-aarch64.so.1")
    assert needs["static"] == agentfit.Needs("static", "amd64", None)
    assert needs["script"] == agentfit.Needs("script", None, "/usr/bin/env", "python3")
    assert agentfit.needs_of(tmp_path, "data") is None
    real = agentfit.needs_of(Path(sys.executable).resolve().parent, Path(sys.executable).name)
    assert real is not None and real.machine is not None  # this very interpreter's ELF


def test_the_runtime_is_extracted_once_per_image_id_and_rechecked(tmp_path: Path) -> None:
    """The first attempt copies the runtime's files out of its image, hashes each; later ones
    reuse the entry without asking the engine; an entry changed since is extracted again."""
    fake, runtime_id, _ = _fake(tmp_path, GLIBC_IMAGE)
    cache = tmp_path / "cache"
    paths = ["/usr/local/bin/claude", "/usr/local/bin/run-claude"]
    first = agentimage.ensure(fake, runtime_id, paths, cache, {})
    assert first.extracted and [f.path for f in first.files] == ["claude", "run-claude"]
    binary = (tmp_path / "runtime-image/usr/local/bin/claude").read_bytes()
    assert first.files[0].sha256 == "sha256:" + hashlib.sha256(binary).hexdigest()
    assert all(f.executable for f in first.files)
    assert (first.folder / "claude").stat().st_mode & 0o7777 == 0o555  # read-only, runnable
    again = agentimage.ensure(fake, runtime_id, paths, cache, {})
    assert not again.extracted and again.digest == first.digest
    assert [c for c in fake.calls if c[0] == "image_files"] == [("image_files", runtime_id)]
    # an entry tampered with (by anyone who could write the state folder) is not believed
    target = first.folder / "run-claude"
    os.chmod(first.folder, 0o700)
    target.chmod(0o700)
    target.write_bytes(b"#!/bin/sh\necho owned\n")
    third = agentimage.ensure(fake, runtime_id, paths, cache, {})
    assert third.extracted and third.digest == first.digest
    assert (third.folder / "run-claude").read_bytes().endswith(b'"$@"\n')


def test_a_runtime_path_that_is_a_link_or_missing_is_refused(tmp_path: Path) -> None:
    fake, runtime_id, _ = _fake(tmp_path, GLIBC_IMAGE)
    with pytest.raises(PolicyViolation, match=r"/usr/local/bin/link is a link.*claude"):
        agentimage.ensure(fake, runtime_id, ["/usr/local/bin/link"], tmp_path / "c", {})
    with pytest.raises(PolicyViolation, match=r"/nope is not in the runtime image"):
        agentimage.ensure(fake, runtime_id, ["/nope"], tmp_path / "c", {})
    assert [p.name for p in (tmp_path / "c").iterdir() if p.is_dir()] == []  # nothing half-made


@pytest.mark.parametrize(
    ("files", "arch", "why"),
    [
        (GLIBC_IMAGE, "amd64", None),
        ({k: v for k, v in GLIBC_IMAGE.items() if k != "lib64"}, "amd64",
         r"claude's dynamic loader /lib64/ld-linux-x86-64\.so\.2"),
        ({k: v for k, v in GLIBC_IMAGE.items() if k != "usr/bin/dash"}, "amd64",
         r"no run-claude's interpreter /bin/sh; no /bin/sh"),
        ({k: v for k, v in GLIBC_IMAGE.items() if k != "usr/bin/bash"}, "amd64",
         r"no bash \(on its PATH /usr/local/bin:/usr/bin\)"),
        (GLIBC_IMAGE, "arm64", r"claude is built for amd64, the image for arm64"),
        ({**GLIBC_IMAGE, "opt": b"a file"}, "amd64", r"no folder at /opt \(something else"),
        ({**GLIBC_IMAGE, "opt/runner-agent": b"x"}, "amd64", r"no folder at /opt/runner-agent"),
        ({**GLIBC_IMAGE, "opt/runner-agent/old": b"x"}, "amd64", None),  # mounted over
        ({**GLIBC_IMAGE, "job/output/x": b"x", "opt": "job/output"}, "amd64",
         r"no folder at /opt \(something else"),  # a link into the job's writable folder
    ],
)  # fmt: skip
def test_a_runtime_that_cannot_run_in_the_contracts_image_is_refused_naming_why(
    tmp_path: Path, files: dict[str, bytes | str], arch: str, why: str | None
) -> None:
    fake, runtime_id, contract_id = _fake(tmp_path, files, arch)
    paths = ["/usr/local/bin/claude", "/usr/local/bin/run-claude"]
    runtime = agentimage.ensure(fake, runtime_id, paths, tmp_path / "cache", {})
    argv = ["/opt/runner-agent/run-claude", "/job/input/prompt.md"]
    info = fake.images[contract_id]

    def check() -> None:
        agentfit.check_fits(fake, info, "paper:1", runtime, argv, ["bash"], {})

    if why is None:
        check()
        return
    with pytest.raises(PolicyViolation, match=why) as refused:
        check()
    assert "paper:1" in refused.value.message and contract_id in refused.value.message
    assert "runIn" in (refused.value.hint or "")


# --------------------------------------------------------------------------- pure: the plan


def _seed_plan(**policy: Any) -> plan.ExecutionPlan:
    contract = load_contract(SEED)
    adapter = {"image": "sha256:" + "c" * 64, "argv": CLAUDE_ARGV, **CLAUDE_RUNTIME}
    pol = HostPolicy.model_validate(
        {"allowUnpinnedImages": True, "agents": {"claude-code": adapter}, **policy}
    )
    return plan.build(contract, pol, job_id="j", host_uid=0, host_gid=0)


def test_the_seeds_network_access_is_what_the_host_grants_agents() -> None:
    """networkAccess true in an agent_planned contract: the policy's egress grants (a package
    index) through the allowlist proxy, never the open bridge; refused when the host grants
    agents nothing, naming the policy fields."""
    grant = {"upstreamNetwork": "uplink", "allow": ["pypi.org:443", "files.pythonhosted.org:443"]}
    p = _seed_plan(egress=grant)
    assert p.limits.network == "egress" and p.egress is not None
    assert [str(x) for x in p.egress.allow] == grant["allow"]
    assert p.image.reference == "citeark-agent/runtime:0.2.0"  # the contract's image runs
    assert p.agent is not None and p.agent.prompt_source == "default"
    with pytest.raises(PolicyViolation, match=r"\$\.environment\.networkAccess.*egress\.allow"):
        _seed_plan()
    with pytest.raises(PolicyViolation, match=r"\$\.environment\.networkAccess"):
        _seed_plan(allowNetwork=True)  # the host's open network is not an agent's


def test_runner_verify_says_which_image_the_agents_commands_run_in(tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    adapter = {"image": "sha256:" + "c" * 64, "argv": CLAUDE_ARGV, **CLAUDE_RUNTIME}
    grant = {"upstreamNetwork": "uplink", "allow": ["pypi.org:443"]}
    policy.write_text(json.dumps({"agents": {"claude-code": adapter}, "egress": grant}))
    args = ["verify", str(SEED), "--allow-unsigned", "--allow-unpinned-image", "--policy"]
    shown = run_cli(*args, str(policy))
    assert shown.returncode == 0, shown.stderr
    line = next(x for x in shown.stdout.splitlines() if x.strip().startswith("agent"))
    assert "its commands run in the contract's image citeark-agent/runtime:0.2.0" in line
    assert "brought in from sha256:" + "c" * 64 in line
    assert "the runner's /job/input/agent-prompt.md" in line
    info = json.loads(run_cli(*args, str(policy), "--json").stdout)["agent"]
    assert info["runIn"] == "contract-image"
    assert info["commandsRunIn"] == "citeark-agent/runtime:0.2.0"
    policy.write_text(
        json.dumps({"agents": {"claude-code": {**adapter, "runIn": "adapter-image"}},
                    "egress": grant})
    )  # fmt: skip
    own = run_cli(*args, str(policy))
    assert "its commands run in the adapter's image sha256:" + "c" * 64 in own.stdout


def test_the_default_prompt_teaches_the_job_layout_and_the_rules() -> None:
    text = (ROOT / "runner" / "agents" / "agent-prompt.md").read_text()
    for needle in (
        "/job/input/task.json",
        "/job/output/result.json",
        "/job/input/result.schema.json",
        "/job/execution/runtime-budget.json",
        "evidencePath",
        "requiredCommandFragments",
        "never",
        "credential",
    ):
        assert needle in text, needle


def test_a_contract_naming_its_own_prompt_still_gets_it(tmp_path: Path) -> None:
    data = json.loads((EXAMPLE / "task.scripted.json").read_text())
    data["environment"]["image"] = "sha256:" + "ab" * 32
    data.pop("contractDigest")
    path = tmp_path / "task.json"
    path.write_text(json.dumps(with_digest(data)))
    adapter = {"image": "sha256:" + "cd" * 32, "argv": SCRIPTED_ARGV, **SCRIPTED_RUNTIME,
               "prompts": {"agent_planned": "/etc/runner/prompt.md"}}  # fmt: skip
    pol = HostPolicy.model_validate({"agents": {"scripted": adapter}})
    p = plan.build(load_contract(path), pol, job_id="j", host_uid=0, host_gid=0)
    assert p.agent is not None and p.agent.prompt_source == "contract"
    assert p.agent.prompt == "/job/input/prompt.scripted.md"
    del data["agent"]["promptPath"]
    path.write_text(json.dumps(with_digest(data)))
    p = plan.build(load_contract(path), pol, job_id="j", host_uid=0, host_gid=0)
    assert p.agent is not None and p.agent.prompt_source == "host"
    assert p.agent.prompt_file == "/etc/runner/prompt.md"


def test_no_contract_input_may_take_a_name_the_runner_writes(tmp_path: Path) -> None:
    """A contract naming its paper agent-prompt.md (or compute-decision.json ...) would have
    it replaced by the runner's own file under its name: refused before anything is staged."""
    from runner.agents import adapters as agents
    from runner.core.errors import ContractError
    from runner.staging import jobdir as staging
    from runner.staging.jobdir import InputRules
    from runner.state.jobdir import JobDir

    assert agents.HOST_PROMPT_NAME in staging.RUNNER_INPUTS
    for name in ("agent-prompt.md", "compute-decision.json", "result.schema.json"):
        data = json.loads((EXAMPLE / "task.scripted.json").read_text())
        data.pop("contractDigest")
        data["paper"]["path"] = name
        (tmp_path / name).write_text("not the paper's own")
        path = tmp_path / "task.json"
        path.write_text(json.dumps(with_digest(data)))
        job = JobDir(tmp_path / "job" / name)
        job.execution.mkdir(parents=True)
        with pytest.raises(ContractError, match="a file the runner writes"):
            staging.stage_inputs(job, load_contract(path), InputRules())


def test_a_fit_is_checked_once_per_pair(tmp_path: Path) -> None:
    """bring(): the first attempt of a (contract image, runtime) pair asks the engine about
    the contract image's files; later ones reuse the fit found (images are immutable by id),
    and a pair that did not fit is asked again every time."""
    fake, runtime_id, contract_id = _fake(tmp_path, GLIBC_IMAGE)
    adapter = {"image": runtime_id, "argv": CLAUDE_ARGV, **CLAUDE_RUNTIME}
    pol = HostPolicy.model_validate({"agents": {"claude-code": adapter}})
    data = json.loads(SEED.read_text())
    data["environment"].update(image=contract_id, networkAccess=False)
    data.pop("contractDigest")
    path = tmp_path / "task.json"
    path.write_text(json.dumps(with_digest(data)))
    p = plan.build(load_contract(path), pol, job_id="j", host_uid=0, host_gid=0)
    record = type("R", (), {})()

    def acquire(pin: Any) -> Any:
        info = fake.images[pin.lookup]
        return type("A", (), {"info": info})(), record

    def bring() -> agentimage.Brought | None:
        return agentimage.bring(fake, p, fake.images[contract_id], acquire, tmp_path / "state", {})

    brought = bring()
    assert brought is not None and brought.path.startswith("/opt/runner-agent:/usr/local/bin")
    asked = [c for c in fake.calls if c == ("image_files", contract_id)]
    bring()
    assert (
        [c for c in fake.calls if c == ("image_files", contract_id)]
        == asked
        == [("image_files", contract_id)]
    )
    (tmp_path / "contract-image" / "lib64").unlink()  # as if another image: no fit remembered
    for fit in agentimage.fits_root(tmp_path / "state").iterdir():
        fit.unlink()
    for _ in range(2):
        with pytest.raises(PolicyViolation, match="dynamic loader"):
            bring()
    assert len([c for c in fake.calls if c == ("image_files", contract_id)]) == 3
