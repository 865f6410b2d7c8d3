"""Agent-planned runs in the contract's own image (issue 26): the contract's pinned image
runs, the agent runtime is brought into it from its adapter's image (extracted once per image
id into a verified cache, mounted read-only at /opt/runner-agent), a runtime that cannot run
there is refused before the attempt, both images are on the record, and the platform's
contract (no agent.promptPath, networkAccess true) runs as issued with the host's prompt.

Pure tests use the fake backend (an image's files are a host folder); the others the real
engine, with real Claude Code against the scripted model (tests/support/model_server.py) and
the scripted runtime.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import struct
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.backends.fake import FakeBackend
from runner.backends.types import ImageInfo
from runner.contract import load_contract, with_digest
from runner.core.errors import PolicyViolation
from runner.execution import agentimage
from runner.planning import plan
from runner.planning.policy import HostPolicy
from tests.support import (
    ROOT,
    SEED,
    SESSION_ID,
    SESSION_LABEL,
    TOY,
    docker,
    run_cli,
    run_job,
    session_containers,
)
from tests.support.agents import (
    CLAUDE_ARGV,
    CLAUDE_RUNTIME,
    EXAMPLE,
    SCRIPTED_ARGV,
    SCRIPTED_RUNTIME,
    agent_contract,
    agent_policy,
    files_holding,
    image_id_of,
    model_server,
)

API_KEY = "sk-ant-test-made-up-for-agent-image-71c3"  # not a real key

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
    needs = {n: agentimage.needs_of(tmp_path, n) for n in ("dyn", "arm", "static", "script")}
    assert needs["dyn"] == agentimage.Needs("dyn", "amd64", LOADER.decode())
    assert needs["arm"] == agentimage.Needs("arm", "arm64", "/lib/ld-linux-aarch64.so.1")
    assert needs["static"] == agentimage.Needs("static", "amd64", None)
    assert needs["script"] == agentimage.Needs("script", None, "/usr/bin/env", "python3")
    assert agentimage.needs_of(tmp_path, "data") is None
    real = agentimage.needs_of(Path(sys.executable).resolve().parent, Path(sys.executable).name)
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
        agentimage.check_fits(fake, info, "paper:1", runtime, argv, ["bash"], {})

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


# --------------------------------------------------------------------------- engine

PAPERLIB = '''"""A library only the paper's image has (the agent's image does not)."""
import json
from pathlib import Path


def accuracy(checkpoint: str) -> float:
    here = Path(checkpoint).resolve().parent
    predictions = json.loads(Path(checkpoint).read_text())["predictions"]
    labels = (here / "labels.txt").read_text().strip()
    return sum(p == t for p, t in zip(predictions, labels)) / len(labels)
'''

EVALUATE_WITH_PAPERLIB = """import argparse, json
import paperlib

parser = argparse.ArgumentParser()
parser.add_argument("--checkpoint", required=True)
args = parser.parse_args()
print(json.dumps({"accuracy": paperlib.accuracy(args.checkpoint), "via": "paperlib"}))
"""


def _build(tag_prefix: str, dockerfile: str, files: dict[str, str]) -> str:
    """An image built offline from ``dockerfile`` and ``files``, tagged by their hash."""
    digest = hashlib.sha256((dockerfile + json.dumps(files, sort_keys=True)).encode())
    tag = f"{tag_prefix}:{digest.hexdigest()[:16]}"
    with tempfile.TemporaryDirectory() as context:
        for name, text in files.items():
            (Path(context) / name).write_text(text)
        (Path(context) / "Dockerfile").write_text(dockerfile)
        built = docker("build", "--network", "none", "-q", "-t", tag, context)
        assert built.returncode == 0, built.stderr
    return image_id_of(tag)


@pytest.fixture(scope="session")
def paper_image(image_id: str) -> str:
    """runner-cpu:local plus a Python library of the paper's own (paperlib)."""
    return _build(
        "runner-test-paper-image",
        f"FROM {image_id}\nCOPY paperlib.py /usr/local/lib/python3.11/dist-packages/\n",
        {"paperlib.py": PAPERLIB},
    )


def _imported(files: dict[str, tuple[int, bytes]], tag: str) -> str:
    """An image made offline with ``docker import`` of a tarball of ``files`` (name → mode,
    bytes): no base, no dynamic loader unless given one."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, (mode, data) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rootfs.tar"
        path.write_bytes(buf.getvalue())
        made = docker("import", str(path), tag)
        assert made.returncode == 0, made.stderr
    return image_id_of(tag)


@pytest.fixture(scope="session")
def loaderless_image(image_id: str) -> str:
    """From scratch, offline: /bin/sh, bash, env and python3 there (as files: nothing of
    this image ever runs), no /lib64 and no glibc loader."""
    fake_exe = (0o755, b"#!/bin/sh\nexit 0\n")
    return _imported(
        {
            "bin/sh": fake_exe,
            "usr/bin/bash": fake_exe,
            "usr/bin/env": fake_exe,
            "usr/bin/python3": fake_exe,
        },
        "runner-test-no-loader:1",
    )


@pytest.fixture(scope="session")
def shellless_image(image_id: str) -> str:
    """From scratch, offline: python3 only; no /bin/sh."""
    return _imported({"usr/bin/python3": (0o755, b"\x7fELF not really\n")}, "runner-test-no-sh:1")


def _paper_contract(folder: Path, image: str, runtime: str = "scripted", **kw: Any) -> Path:
    contract = agent_contract(folder, runtime=runtime, image=image, **kw)
    (folder / "repository" / "evaluate.py").write_text(EVALUATE_WITH_PAPERLIB)
    return contract


def _scripted_policy(folder: Path, image: str, **adapter: Any) -> list[str]:
    path = agent_policy(
        folder,
        "scripted",
        image,
        argv=SCRIPTED_ARGV,
        usage="claude-code",
        **{**SCRIPTED_RUNTIME, **adapter},
    )
    return ["--policy", str(path)]


def _ledger(job: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (job / "record" / "ledger.jsonl").read_text().splitlines()]


def _cache_entries(state: Path) -> list[Path]:
    return sorted(p for p in (state / "cache" / "agent-runtimes").iterdir() if p.is_dir())


@pytest.mark.docker
def test_claude_codes_bash_imports_a_library_only_the_contracts_image_has(
    tmp_path: Path, paper_image: str, claude_agent_image: str
) -> None:
    """The real Claude Code, driven by the scripted model, runs evaluate.py (which imports
    paperlib) with its Bash tool: it runs in the paper's image, so the import works and the
    run succeeds with 0.819; the agent's image lacks the library. Both images are on the
    record and in the signed statement's materials."""
    lacks = docker("run", "--rm", "--network", "none", "--entrypoint", "python3",
                   claude_agent_image, "-c", "import paperlib")  # fmt: skip
    assert lacks.returncode != 0 and "No module named 'paperlib'" in lacks.stderr
    prompt = (EXAMPLE / "prompt.md").read_text()
    contract = _paper_contract(
        tmp_path,
        paper_image,
        runtime="claude-code",
        prompt=prompt,
        agent={"model": "claude-sonnet-4-5", "effort": "low", "maxTurns": 10},
        change=lambda d: d["environment"].update(memoryGb=2, timeoutMinutes=5),
    )
    env, err = _claude_run(tmp_path, contract, claude_agent_image)
    assert env["status"] == "succeeded", (env["failure"], err)
    assert env["measurements"][0]["value"] == 0.819
    job = Path(env["jobDir"])
    evidence = json.loads((job / "output" / "logs" / "evaluation.log").read_text())
    assert evidence["via"] == "paperlib"
    assert env["image"]["id"] == paper_image
    agent = env["agent"]
    assert (agent["runIn"], agent["commandsImageId"]) == ("contract-image", paper_image)
    brought = agent["agentRuntime"]
    assert brought["image"]["id"] == claude_agent_image
    assert brought["mountedAt"] == "/opt/runner-agent"
    assert [f["path"] for f in brought["files"]] == ["claude", "run-claude"]
    materials = {m["name"].split(":", 1)[0]: m for m in env["materials"]}
    assert materials["image"]["digest"]["sha256"] == paper_image.removeprefix("sha256:")
    assert materials["agent-runtime"]["digest"]["sha256"] == claude_agent_image.removeprefix(
        "sha256:"
    )
    assert materials["agent-runtime"]["annotations"]["filesDigest"] == brought["filesDigest"]
    assert files_holding(job, API_KEY.encode()) == []
    assert not session_containers()


def _claude_run(
    folder: Path, contract: Path, image: str, **policy_extra: Any
) -> tuple[dict[str, Any], str]:
    key_file = folder / "anthropic-api-key"
    key_file.write_text(API_KEY + "\n")
    with model_server(folder, "evaluate") as server:
        path = agent_policy(
            folder,
            "claude-code",
            image,
            argv=CLAUDE_ARGV,
            **CLAUDE_RUNTIME,
            env={"ANTHROPIC_BASE_URL": server.base_url, "CLAUDE_CODE_MAX_RETRIES": "0"},
            secrets=[{"env": "ANTHROPIC_API_KEY", "file": str(key_file)}],
            allow=[f"{server.host}:{server.port}"],
            usage="claude-code",
            egress={"upstreamNetwork": server.network},
        )
        if policy_extra:
            data = json.loads(path.read_text())
            data.update(policy_extra)
            path.write_text(json.dumps(data))
        _, env, err = run_job(contract, folder / "state", "--policy", str(path))
    return env, err


@pytest.fixture
def seed_image_tag(image_id: str) -> Iterator[str]:
    """The seed's environment.image (a tag of the platform's), standing for runner-cpu here."""
    tag = "citeark-agent/runtime:0.2.0"
    made = docker("tag", image_id, tag)
    assert made.returncode == 0, made.stderr
    yield tag
    docker("rmi", tag)


@pytest.mark.docker
def test_the_seeds_contract_verbatim_reaches_an_envelope(
    tmp_path: Path, seed_image_tag: str, claude_agent_image: str, image_id: str
) -> None:
    """The platform's contract as issued (no agent.promptPath, networkAccess true, its own
    image tag), byte for byte, on a host with a claude-code adapter and a scripted model: the
    runner's default prompt is staged and hashed like an input, the agent runs in the
    contract's image, and the run ends in an envelope with the toy's 0.819."""
    shutil.copy(SEED, tmp_path / "task.json")
    assert (tmp_path / "task.json").read_bytes() == SEED.read_bytes()
    shutil.copy(TOY / "paper.md", tmp_path / "paper.md")
    shutil.copytree(TOY / "repository", tmp_path / "repository")
    env, err = _claude_run(tmp_path, tmp_path / "task.json", claude_agent_image,
                           allowUnpinnedImages=True)  # fmt: skip
    assert env["contractDigest"] == json.loads(SEED.read_text())["contractDigest"]
    assert env["status"] == "succeeded", (env["failure"], err)
    assert env["agentResult"]["valid"] is True, env["agentResult"]
    assert env["measurements"] and env["measurements"][0]["value"] == 0.819, (env, err)
    assert env["image"]["id"] == image_id and env["image"]["reference"] == seed_image_tag
    agent = env["agent"]
    default = (ROOT / "runner" / "agents" / "agent-prompt.md").read_bytes()
    digest = "sha256:" + hashlib.sha256(default).hexdigest()
    assert agent["promptSource"] == "default" and agent["prompt"] == "/job/input/agent-prompt.md"
    assert agent["hostPrompt"]["sha256"] == digest
    assert {"field": "runner:default-prompt", "path": "agent-prompt.md", "digest": digest} in env[
        "inputs"
    ]
    assert any(m["name"] == "input/agent-prompt.md" for m in env["materials"])
    job = Path(env["jobDir"])
    assert (job / "input" / "agent-prompt.md").read_bytes() == default
    manifest = json.loads((job / "execution" / "input-manifest.json").read_text())
    assert "agent-prompt.md" in {f["path"] for f in manifest["files"]}
    assert env["limits"]["network"] == "egress"  # networkAccess: the host's grant for agents
    assert {c["host"] for c in env["egress"]["connections"]} == {"model.test"}
    assert not session_containers()


@pytest.mark.docker
@pytest.mark.hostile
def test_a_runtime_without_its_loader_in_the_contracts_image_is_refused_before_the_attempt(
    tmp_path: Path, loaderless_image: str, claude_agent_image: str
) -> None:
    """An image from scratch without glibc's loader: Claude Code cannot run there. The
    attempt is refused before any container starts, naming the loader and the image."""
    contract = agent_contract(tmp_path, runtime="claude-code", image=loaderless_image)
    path = agent_policy(tmp_path, "claude-code", claude_agent_image, argv=CLAUDE_ARGV,
                        usage="claude-code", **CLAUDE_RUNTIME)  # fmt: skip
    code, env, err = run_job(contract, tmp_path / "state", "--policy", str(path))
    assert code == 3, err
    failure = env["failure"]
    assert (failure["category"], failure["stage"]) == ("policy_violation", "image")
    assert "dynamic loader /lib64/ld-linux-x86-64.so.2" in failure["reason"]
    assert loaderless_image in failure["reason"]
    ledger = _ledger(Path(env["jobDir"]))
    assert not any(e["type"] == "attempt.starting" for e in ledger)
    assert not session_containers()


@pytest.mark.docker
@pytest.mark.hostile
def test_a_contract_image_without_bin_sh_is_refused_for_the_scripted_runtime(
    tmp_path: Path, shellless_image: str, scripted_agent_image: str
) -> None:
    contract = agent_contract(tmp_path, image=shellless_image)
    code, env, err = run_job(
        contract, tmp_path / "state", *_scripted_policy(tmp_path, scripted_agent_image)
    )
    assert code == 3, err
    assert env["failure"]["stage"] == "image"
    assert "no /bin/sh" in env["failure"]["reason"], env["failure"]
    assert not session_containers()


@pytest.mark.docker
def test_a_missing_contract_image_is_refused_before_staging(
    tmp_path: Path, scripted_agent_image: str
) -> None:
    """The contract's image is resolved like any job's, before the inputs are staged:
    absent, the run is refused with nothing staged and no container."""
    missing = "sha256:" + "0" * 64
    contract = agent_contract(tmp_path, image=missing)
    code, env, err = run_job(
        contract, tmp_path / "state", *_scripted_policy(tmp_path, scripted_agent_image)
    )
    assert code == 4, err  # as a fixed entrypoint's missing image
    assert env["failure"]["category"] == "image_unavailable"
    assert env["failure"]["stage"] == "image"
    assert missing in env["failure"]["reason"]
    staged = Path(env["jobDir"]) / "input"
    assert not (staged / "repository").exists() and not (staged / "task.json").exists()
    assert env["timings"]["stageSeconds"] is None, env["timings"]
    assert not session_containers()


@pytest.mark.docker
def test_the_scripted_runtime_runs_in_the_contracts_image_and_is_extracted_once(
    tmp_path: Path, paper_image: str, scripted_agent_image: str
) -> None:
    """The scripted runtime (Python: the paper's python3 runs it) in the paper's image: the
    import works, 0.819. A second job with the same runtime uses the cached runtime (no
    second extraction). With runIn adapter-image (today's way, kept) the agent's commands
    run in the runtime's image, where paperlib is missing, and the run fails."""
    state = tmp_path / "state"
    first = tmp_path / "first"
    first.mkdir()
    contract = _paper_contract(first, paper_image)
    code, env, err = run_job(contract, state, *_scripted_policy(tmp_path, scripted_agent_image))
    assert code == 0, (env["failure"], err)
    assert env["measurements"][0]["value"] == 0.819
    assert env["image"]["id"] == paper_image
    entries = _cache_entries(state)
    assert len(entries) == 1 and entries[0].name.startswith(
        scripted_agent_image.removeprefix("sha256:")
    )
    stamp = (entries[0] / "runtime.json").stat().st_ino
    second = tmp_path / "second"
    second.mkdir()
    contract2 = _paper_contract(second, paper_image, change=lambda d: d.update(name="second"))
    label = f"{SESSION_LABEL}={SESSION_ID}"
    policy = _scripted_policy(tmp_path, scripted_agent_image)
    human = run_cli("run", str(contract2), "--state-dir", str(state), "--label", label,
                    "--allow-unsigned", *policy)  # fmt: skip
    assert human.returncode == 0, human.stderr
    said = next(x for x in human.stderr.splitlines() if "commands run in" in x)
    assert paper_image[:19] in said and "the contract's image" in said
    assert "cached" in said and "copied out" not in said
    row = next(x for x in human.stdout.splitlines() if x.startswith("agent"))
    assert f"commands in the contract's image, runtime from {scripted_agent_image}" in row
    code, env2, err2 = run_job(contract2, state, *_scripted_policy(tmp_path, scripted_agent_image))
    assert code == 0, (env2["failure"], err2)
    assert _cache_entries(state) == entries
    assert (entries[0] / "runtime.json").stat().st_ino == stamp
    assert (
        env2["agent"]["agentRuntime"]["filesDigest"] == env["agent"]["agentRuntime"]["filesDigest"]
    )
    # today's way, as an explicit adapter option: the runtime's image runs, without paperlib
    third = tmp_path / "third"
    third.mkdir()
    contract3 = _paper_contract(third, paper_image, change=lambda d: d.update(name="third"))
    own = _scripted_policy(third, scripted_agent_image, runIn="adapter-image", runtimePaths=[])
    _, env3, _ = run_job(contract3, state, *own)
    assert env3["status"] != "succeeded"
    assert env3["image"]["id"] == scripted_agent_image
    assert env3["agent"]["runIn"] == "adapter-image" and env3["agent"]["agentRuntime"] is None
    transcript = Path(env3["jobDir"]) / "output" / "logs" / "stdout.log"
    assert "No module named 'paperlib'" in transcript.read_text()
    assert not session_containers()


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
    from runner.staging.jobdir import InputRules, JobDir

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


def test_cache_verify_rehashes_the_agent_runtimes(tmp_path: Path) -> None:
    """An edit that keeps size, mode, inode and mtime (not ctime: the cheap check an attempt
    makes sees it too); `runner cache verify` re-hashes the runtime's files, names the file
    and removes the entry (with --keep: only lists it)."""
    fake, runtime_id, _ = _fake(tmp_path, GLIBC_IMAGE)
    state = tmp_path / "state"
    paths = ["/usr/local/bin/claude", "/usr/local/bin/run-claude"]
    got = agentimage.ensure(fake, runtime_id, paths, agentimage.cache_root(state), {})
    ok = run_cli("cache", "verify", "--state-dir", str(state), "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["agentRuntimes"] == {"checked": 1, "bad": []}
    target = got.folder / "claude"
    st = target.stat()
    os.chmod(got.folder, 0o700)
    target.chmod(0o600)
    with target.open("r+b") as f:  # one byte, same size
        f.seek(100)
        f.write(b"X")
    target.chmod(0o555)
    os.chmod(got.folder, 0o555)  # noqa: S103 - as it was
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    kept = run_cli("cache", "verify", "--state-dir", str(state), "--keep", "--json")
    assert kept.returncode == 1
    bad = json.loads(kept.stdout)["agentRuntimes"]["bad"]
    assert [b["problem"] for b in bad] == ["claude changed since it was extracted"]
    assert got.folder.exists()
    removed = run_cli("cache", "verify", "--state-dir", str(state))
    assert removed.returncode == 1 and "removed agent runtime" in removed.stdout
    assert not got.folder.exists()
    assert agentimage.ensure(fake, runtime_id, paths, agentimage.cache_root(state), {}).extracted


@pytest.mark.docker
@pytest.mark.hostile
def test_a_contract_image_with_a_file_where_the_runtime_mounts_is_refused_not_a_runner_failure(
    tmp_path: Path, image_id: str, scripted_agent_image: str
) -> None:
    """The paper's image puts a file at /opt/runner-agent (the engine could not mount the
    runtime there, and the attempt would fail as the runner's own infrastructure): refused
    before the attempt, naming the path and the image."""
    blocked = _build(
        "runner-test-blocked-mount",
        f"FROM {image_id}\nCOPY blocker /opt/runner-agent\n",
        {"blocker": "not a folder\n"},
    )
    contract = agent_contract(tmp_path, image=blocked)
    code, env, err = run_job(
        contract, tmp_path / "state", *_scripted_policy(tmp_path, scripted_agent_image)
    )
    assert code == 3, (env["failure"], err)
    assert env["failure"]["category"] == "policy_violation"
    assert "no folder at /opt/runner-agent" in env["failure"]["reason"]
    assert blocked in env["failure"]["reason"]
    assert not session_containers()
