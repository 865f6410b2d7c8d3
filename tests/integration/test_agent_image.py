"""Agent-planned runs in the contract's own image (issue 26): the contract's pinned image
runs, the agent runtime is brought into it from its adapter's image (extracted once per image
id into a verified cache, mounted read-only at /opt/runner-agent), a runtime that cannot run
there is refused before the attempt, both images are on the record, and the platform's
contract (no agent.promptPath, networkAccess true) runs as issued with the host's prompt.

Pure tests use the fake backend (an image's files are a host folder); the others the real
engine, with real Claude Code against the scripted model (tests/support/model_server.py) and
the scripted runtime.

The tests that need no engine are in tests/unit/test_agent_image.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.execution import agentimage
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
from tests.unit.test_agent_image import (  # noqa: F401  (shared with the pure half; fixtures among them)
    GLIBC_IMAGE,
    LOADER,
    _elf,
    _fake,
    _image_root,
)

API_KEY = "sk-ant-test-made-up-for-agent-image-71c3"  # not a real key


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
            egress=server.egress(),
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


@pytest.mark.docker  # `runner cache verify` lists the engine's containers
def test_cache_verify_rehashes_the_agent_runtimes(tmp_path: Path) -> None:
    """An edit that keeps size, mode, inode and mtime (not ctime: the cheap check an attempt
    makes sees it too); `runner cache verify` re-hashes the runtime's files, names the file
    and removes the entry (with --keep: only lists it)."""
    fake, runtime_id, _ = _fake(tmp_path, GLIBC_IMAGE)
    state = tmp_path / "state"
    paths = ["/usr/local/bin/claude", "/usr/local/bin/run-claude"]
    got = agentimage.ensure(fake, runtime_id, paths, agentimage.cache_root(state), {})
    agentimage.release(got)  # as an attempt does when it ends: verify may remove it
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
