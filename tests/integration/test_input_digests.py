"""Inputs bound to the contract, through `runner run` on the real engine: a signed contract
whose inputs changed after signing is refused before any container exists, naming the path; a
git checkout at another commit likewise; input/ is read-only to the job and checked again after
it, and the envelope says so."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from runner.contract import with_digest
from tests.support import (
    json_measurement,
    run_cli,
    run_job,
    session_containers,
    start_job,
    wait_running,
    write_contract,
)
from tests.support.inputs import INPUT_CHANGES, add_link

pytestmark = pytest.mark.docker


def _sign(tmp_path: Path, contract: Path) -> tuple[Path, Path]:
    """`runner sign` with a fresh issuer key; the envelope and the folder trusting the key."""
    keys = tmp_path / "trusted"
    assert run_cli("keygen", "--out", str(tmp_path / "issuer")).returncode == 0
    trusted = run_cli("trust", str(tmp_path / "issuer.pub"), "--trusted-keys", str(keys))
    assert trusted.returncode == 0, trusted.stderr
    signed = run_cli("sign", str(contract), "--key", str(tmp_path / "issuer.key"), "--json")
    assert signed.returncode == 0, signed.stderr
    out = json.loads(signed.stdout)
    assert set(out["inputs"]) == {"$.paper.digest", "$.repository.digest"}
    return Path(out["envelope"]), keys


def _payload(envelope: Path) -> dict[str, Any]:
    """The signed contract inside a DSSE envelope."""
    return dict(json.loads(base64.b64decode(json.loads(envelope.read_text())["payload"])))


def _refused_before_any_container(
    envelope: Path, tmp_path: Path, keys: Path, *words: str
) -> dict[str, Any]:
    before = session_containers()
    state = tmp_path / "state"
    code, env, err = run_job(envelope, state, "--trusted-keys", str(keys), unsigned=False)
    assert code == 3, (env, err)
    failure = env["failure"]
    assert failure["category"] == "input_digest_mismatch", failure
    assert failure["stage"] == "stage" and failure["retryable"] is False
    for word in words:
        assert word in failure["reason"], failure["reason"]
    assert "runner pin" in failure["reason"]  # the hint: re-pin and re-sign if intended
    # The image is acquired before the inputs are staged (a pin this host cannot resolve is
    # refused with nothing staged), so it may be known; no container ever is.
    assert env["container"] is None and env["exitCode"] is None
    assert session_containers() == before == []
    ledger = (Path(env["jobDir"]) / "record" / "ledger.jsonl").read_text()
    assert "attempt.starting" not in ledger
    return env


@pytest.mark.parametrize("case", INPUT_CHANGES)
def test_signed_inputs_changed_after_signing_are_refused(
    tmp_path: Path, image_id: str, case: str
) -> None:
    folder = tmp_path / "c"
    folder.mkdir()
    contract = write_contract(folder, image_id)
    add_link(folder)
    envelope, keys = _sign(tmp_path, contract)
    signed = _payload(envelope)
    change, name, said = INPUT_CHANGES[case]
    change(folder)
    _refused_before_any_container(
        envelope, tmp_path, keys, f"$.{name}.path", said, signed[name]["digest"]
    )


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(repo.parent),
    }
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True
    )
    return proc.stdout.strip()


def test_git_checkout_at_the_wrong_commit_is_refused(tmp_path: Path, image_id: str) -> None:
    """The repository is a git checkout of its second commit; the signed contract names the
    first: refused, naming the file that differs, before any container exists."""
    folder = tmp_path / "c"
    folder.mkdir()
    repo = folder / "repository"
    contract = write_contract(folder, image_id)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "one")
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "labels.txt").write_text("relabelled\n")
    _git(repo, "commit", "-q", "-am", "two")
    data = json.loads(contract.read_text())
    data["repository"]["commit"] = first
    contract.write_text(json.dumps(with_digest(data)))
    envelope, keys = _sign(tmp_path, contract)  # the digest binds the tree as it is
    _refused_before_any_container(
        envelope, tmp_path, keys, "$.repository.commit", "repository/labels.txt", first
    )


WRITE_INPUT = r"""
import errno, json, os
tries = {}
def attempt(name, action):
    try:
        action()
        tries[name] = "done"
    except OSError as exc:
        tries[name] = errno.errorcode.get(exc.errno, str(exc.errno))
attempt("append", lambda: open("/job/input/repository/evaluate.py", "a").write("x"))
attempt("create", lambda: open("/job/input/repository/new.py", "w").write("x"))
attempt("remove", lambda: os.remove("/job/input/paper.md"))
attempt("rename", lambda: os.rename("/job/input/task.json", "/job/input/t.json"))
attempt("link", lambda: os.symlink("/etc/shadow", "/job/input/repository/shadow"))
attempt("mkdir", lambda: os.mkdir("/job/input/repository/d"))
attempt("chmod", lambda: os.chmod("/job/input/repository/evaluate.py", 0o777))
mounts = [line.split() for line in open("/proc/self/mountinfo")]
options = next(m[5] for m in mounts if m[4] == "/job/input").split(",")
# Permissions may refuse first (EACCES, EPERM: the staged files are the runner's); the mount
# refuses every change to the namespace itself, whoever asks.
ok = (
    "ro" in options
    and all(v in ("EROFS", "EACCES", "EPERM") for v in tries.values())
    and all(tries[k] == "EROFS" for k in ("create", "remove", "rename", "link", "mkdir"))
)
json.dump({"ok": int(ok), "tries": tries, "options": options}, open("/job/output/probe.json", "w"))
"""


def test_input_is_read_only_and_checked_again_after_the_job(tmp_path: Path, image_id: str) -> None:
    """A job that tries to change /job/input (write, create, remove, rename, link, mkdir,
    chmod) fails each time (EROFS for every change of a folder: the mount is read-only); after
    it the runner re-hashes input/ and the envelope says it is unchanged, listing each input
    with its digest (the signed contract's)."""
    folder = tmp_path / "c"
    folder.mkdir()
    contract = write_contract(
        folder,
        image_id,
        command=["python3", "-c", WRITE_INPUT],
        measurements=[json_measurement("probe.json", "/ok", metric="ok")],
    )
    add_link(folder)
    envelope, keys = _sign(tmp_path, contract)
    signed = _payload(envelope)
    code, env, err = run_job(
        envelope, tmp_path / "state", "--trusted-keys", str(keys), unsigned=False
    )
    assert code == 0, (env, err)
    probe = json.loads((Path(env["jobDir"]) / "output" / "probe.json").read_text())
    assert probe["ok"] == 1, probe
    assert env["measurements"][0]["value"] == 1
    assert env["inputsUnchanged"] is True, env["warnings"]
    assert env["inputs"] == [
        {"field": "$.paper.path", "path": "paper.md", "digest": signed["paper"]["digest"]},
        {
            "field": "$.repository.path",
            "path": "repository",
            "digest": signed["repository"]["digest"],
        },
    ]


def test_inputs_changed_on_the_host_during_the_job_fail_the_run(
    tmp_path: Path, image_id: str
) -> None:
    """input/ changed under the job (here by the host, the one party that can write it):
    the run is input_digest_mismatch (exit 3, never succeeded), its reason names the path,
    and the envelope says inputsUnchanged false (issue 25 item 4)."""
    contract = write_contract(tmp_path, image_id, command=["sleep", "3"], measurements=None)
    state = tmp_path / "state"
    proc = start_job(contract, state)
    wait_running(proc)
    (staged,) = state.glob("jobs/*/input/repository")
    (staged / "planted.py").write_text("x = 1\n")
    out, err = proc.communicate(timeout=120)
    env = json.loads(out)
    assert env["inputsUnchanged"] is False, (env, err)
    assert proc.returncode == 3, (env.get("failure"), err)
    assert env["status"] == "failed"
    assert env["failure"]["category"] == "input_digest_mismatch", env["failure"]
    assert "input/repository/planted.py was added" in env["failure"]["reason"], env["failure"]
