"""Assets in real jobs (issue 16): fetched from a loopback server on the host, mounted
read-only at /job/assets/<path>, read by a job that has no network, never writable by it,
listed as materials, and kept by prune while a job that uses them runs."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from runner.caches.assets import AssetCache
from tests.support import SESSION_ID, SESSION_LABEL, json_measurement, run_cli, run_job
from tests.support import write_contract as write_toy
from tests.support.asset_server import AssetServer, Served, asset_server

pytestmark = pytest.mark.docker

BODY = os.urandom(256 * 1024 + 3)
HEX = hashlib.sha256(BODY).hexdigest()


def _tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("labels/a.txt", b"cat\n"), ("labels/b.txt", b"dog\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


TAR = _tar()

READER = r"""
import hashlib, json, os
blob = "/job/assets/data/blob.bin"
digest = hashlib.sha256(open(blob, "rb").read()).hexdigest()
print("sha256", digest, flush=True)
tried = {}
for target in (blob, "/job/assets/new.txt", "/job/assets/labels/labels/a.txt",
               "/job/assets/labels/c.txt"):
    try:
        with open(target, "ab") as f:
            f.write(b"x")
        tried[target] = "written"
    except OSError as exc:
        tried[target] = exc.strerror
try:
    os.chmod(blob, 0o666)
    tried["chmod"] = "changed"
except OSError as exc:
    tried["chmod"] = exc.strerror
labels = sorted(os.listdir("/job/assets/labels/labels"))
json.dump({"accuracy": 1.0, "digest": digest, "tried": tried, "labels": labels},
          open("/job/output/out.json", "w"))
"""


def _assets(server: AssetServer) -> list[dict[str, Any]]:
    return [
        {"id": "data", "sources": [server.url("blob.bin")], "sha256": f"sha256:{HEX}",
         "size": len(BODY), "path": "data/blob.bin"},
        {"id": "labels", "sources": [server.url("labels.tgz")], "unpack": "tar",
         "sha256": "sha256:" + hashlib.sha256(TAR).hexdigest(), "size": len(TAR),
         "path": "labels"},
    ]  # fmt: skip


def _contract(folder: Path, server: AssetServer, command: list[str], image: str) -> Path:
    def change(data: dict[str, Any]) -> None:
        data["assets"] = _assets(server)

    return write_toy(
        folder,
        image,
        command=command,
        measurements=[json_measurement("out.json")],
        with_inputs=False,
        change=change,
    )


def _policy(folder: Path, **assets: Any) -> Path:
    path = folder / "policy.json"
    grant = {"allowHosts": ["127.0.0.1"], **assets}
    path.write_text(json.dumps({"acceptUnsigned": True, "assets": grant}))
    return path


@pytest.fixture
def server() -> Any:
    with asset_server() as s:
        s.files["blob.bin"] = Served(BODY)
        s.files["labels.tgz"] = Served(TAR)
        yield s


def test_a_fetched_asset_is_read_offline_and_never_written(
    tmp_path: Path, server: AssetServer, image_id: str
) -> None:
    """`runner fetch`, then `runner run`: the job (no network) reads the asset at its path and
    prints its SHA-256; it cannot write, add to or chmod anything under /job/assets; the
    envelope lists each asset as a material by digest; the cache is unchanged."""
    contract = _contract(tmp_path, server, ["python3", "-c", READER], image_id)
    policy = _policy(tmp_path)
    state = tmp_path / "state"
    fetched = run_cli("fetch", str(contract), "--policy", str(policy), "--state-dir", str(state),
                      "--json")  # fmt: skip
    assert fetched.returncode == 0, fetched.stderr
    assert [a["cached"] for a in json.loads(fetched.stdout)["assets"]] == [False, False]
    gets = len(server.log.requests)
    code, env, err = run_job(contract, state, "--policy", str(policy))
    assert code == 0, (env.get("failure"), err)
    assert len(server.log.requests) == gets  # nothing fetched again
    assert env["limits"]["network"] == "none"
    job = Path(env["jobDir"])
    out = json.loads((job / "output" / "out.json").read_text())
    assert out["digest"] == HEX
    assert f"sha256 {HEX}" in (job / "output" / "logs" / "evaluation.log").read_text()
    assert out["labels"] == ["a.txt", "b.txt"]
    assert set(out["tried"].values()) <= {"Read-only file system", "Permission denied"}, out
    names = {m["name"]: m for m in env["materials"]}
    assert names["asset:data"]["digest"] == {"sha256": HEX}
    assert names["asset:data"]["annotations"]["path"] == "/job/assets/data/blob.bin"
    assert names["asset:labels"]["digest"]["sha256"] == hashlib.sha256(TAR).hexdigest()
    cache = AssetCache.of_state(state)
    assert cache.blob(HEX).read_bytes() == BODY
    assert not (cache.tree(hashlib.sha256(TAR).hexdigest(), "tar") / "labels" / "c.txt").exists()
    record = json.loads((job / "record" / "assets.json").read_text())
    assert [a["id"] for a in record["assets"]] == ["data", "labels"]


def test_a_missing_asset_is_refused_unless_the_policy_fetches_on_run(
    tmp_path: Path, server: AssetServer, image_id: str
) -> None:
    """fetchOnRun off: asset_unavailable naming the asset and `runner fetch`, no container.
    fetchOnRun on: `runner run` fetches it first and the job runs."""
    contract = _contract(tmp_path, server, ["python3", "-c", READER], image_id)
    state = tmp_path / "state"
    code, env, _ = run_job(contract, state, "--policy", str(_policy(tmp_path)))
    assert code == 4
    failure = env["failure"]
    assert failure["category"] == "asset_unavailable" and failure["stage"] == "stage"
    assert "'data'" in failure["reason"] and "runner fetch" in failure["reason"]
    assert env["container"] is None
    assert server.log.requests == []
    code, env, err = run_job(
        contract, state, "--policy", str(_policy(tmp_path, fetchOnRun=True)), "--job-id", "j2"
    )
    assert code == 0, (env.get("failure"), err)
    assert server.gets("blob.bin") == 1


def test_prune_keeps_the_assets_of_a_running_job(
    tmp_path: Path, server: AssetServer, image_id: str
) -> None:
    """While a job that uses the assets runs, prune removes nothing of them; once it has
    ended, prune removes them."""
    marker = "/job/output/out.json"
    command = ["sh", "-c", f"echo '{{\"accuracy\": 1}}' > {marker}; sleep 4"]
    contract = _contract(tmp_path, server, command, image_id)
    policy = _policy(tmp_path, fetchOnRun=True)
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", "run", str(contract), "--state-dir", str(state),
         "--policy", str(policy), "--json", "--label", f"{SESSION_LABEL}={SESSION_ID}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        jobs = state / "jobs"
        deadline = time.monotonic() + 120
        while not list(jobs.glob("*/output/out.json")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        pruned = run_cli("cache", "prune", "--state-dir", str(state), "--json")
        assert pruned.returncode == 0, pruned.stderr
        report = json.loads(pruned.stdout)
        assert report["removed"] == []
        assert len(report["keptInUse"]) == 2
        assert AssetCache.of_state(state).blob(HEX).exists()
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    after = json.loads(run_cli("cache", "prune", "--state-dir", str(state), "--json").stdout)
    assert after["removedBytes"] > len(BODY)
    assert not AssetCache.of_state(state).blob(HEX).exists()


def test_two_jobs_at_once_download_their_asset_once(
    tmp_path: Path, server: AssetServer, image_id: str
) -> None:
    """Two `runner run` of jobs that need the same (slowly served) assets, at once, with
    fetchOnRun: each asset is downloaded once and both jobs read it."""
    server.files["blob.bin"].delay_per_chunk = 0.75  # 4 chunks: about 3 s, long enough to overlap
    contract = _contract(tmp_path, server, ["python3", "-c", READER], image_id)
    policy = _policy(tmp_path, fetchOnRun=True)
    state = tmp_path / "state"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runner",
                "run",
                str(contract),
                "--state-dir",
                str(state),
                "--policy",
                str(policy),
                "--json",
                "--job-id",
                f"twin-{i}",
                "--label",
                f"{SESSION_LABEL}={SESSION_ID}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    for out, _ in outs:
        job = Path(json.loads(out)["jobDir"])
        assert json.loads((job / "output" / "out.json").read_text())["digest"] == HEX
    assert server.gets("blob.bin") == 1
    assert server.gets("labels.tgz") == 1
