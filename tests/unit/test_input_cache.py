"""The input cache (issue 16 item 4): a job's inputs bound by digest are hard-linked from
``<state>/cache/inputs`` into ``input/`` without reading their source; entries are read-only,
checked on the way, re-hashed by ``runner cache verify``, listed and pruned with the assets
(never while a job that has not ended uses them). Real files throughout; the containers' side
(a job cannot reach a cached byte) is in tests/integration/test_hostile_inputcache.py, on the real
engine."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from runner.app import issuer
from runner.caches import inputcache
from runner.caches.assetcache import entries, prune
from runner.caches.assets import AssetCache
from runner.caches.inputcache import InputCache
from runner.contract import VerifiedContract, load_contract
from runner.core.errors import ContractError, InputDigestMismatch, PolicyViolation
from runner.execution import layout
from runner.staging import jobdir as staging
from runner.staging.jobdir import InputRules
from runner.state.jobdir import JobDir, StateDir
from tests.support import IMAGE, run_cli, write_contract

PAPER, REPO = "$.paper.path", "$.repository.path"


def _pinned(folder: Path) -> VerifiedContract:
    """The toy contract with its inputs in ``folder``, their digests bound (`runner pin`)."""
    path = write_contract(folder, IMAGE)
    issuer.pin(path)
    return load_contract(path)


def _stage(
    state: StateDir, job_id: str, contract: VerifiedContract, rules: InputRules | None = None
) -> tuple[JobDir, inputcache.Staged]:
    job = staging.prepare(state.job(job_id).root)
    done = inputcache.Staged([], [], [])
    via = inputcache.stager(InputCache.of_state(state.root), job, done=done)
    staging.stage_inputs(job, contract, rules, via=via)
    return job, done


def _hex(contract: VerifiedContract, what: str) -> str:
    obj = getattr(contract.model, what)
    return str(obj.digest).removeprefix("sha256:")


def _files(root: Path) -> dict[str, os.stat_result]:
    out = {}
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            out[str(path.relative_to(root))] = os.lstat(path)
    return out


def test_a_second_job_links_the_cached_inputs_without_reading_their_source(
    tmp_path: Path,
) -> None:
    """Job 1 copies and hashes, and its copy becomes the entry (same inodes: no third copy).
    The sources are then moved away: job 2 still stages, from the cache, every file the same
    inode as the entry's, with the same manifest as job 1."""
    contract = _pinned(tmp_path / "c")
    state = StateDir(tmp_path / "state")
    first, done = _stage(state, "j1", contract)
    assert done.copied == [PAPER, REPO] and done.cached == [PAPER, REPO] and done.linked == []
    cache = InputCache.of_state(state.root)
    repo_hex = _hex(contract, "repository")
    cached = _files(cache.data(repo_hex))
    staged1 = _files(first.input / "repository")
    assert cached and {k: v.st_ino for k, v in cached.items()} == {
        k: v.st_ino for k, v in staged1.items()
    }
    (tmp_path / "c" / "repository").rename(tmp_path / "elsewhere")
    (tmp_path / "c" / "paper.md").unlink()
    second, done = _stage(state, "j2", contract)
    assert done.linked == [PAPER, REPO] and done.copied == []
    staged2 = _files(second.input / "repository")
    assert {k: v.st_ino for k, v in staged2.items()} == {k: v.st_ino for k, v in cached.items()}
    paper = os.lstat(second.input / "paper.md")
    assert paper.st_ino == os.lstat(cache.data(_hex(contract, "paper"))).st_ino
    manifest = lambda job: json.loads((job.execution / "input-manifest.json").read_text())  # noqa: E731
    assert manifest(second) == manifest(first)
    assert staging.recheck_inputs(second).unchanged is True
    record = json.loads((second.record / "inputs.json").read_text())
    assert {u["field"] for u in record["inputs"]} == {PAPER, REPO}


def test_a_cache_entry_is_read_only_files_and_folders(tmp_path: Path) -> None:
    contract = _pinned(tmp_path / "c")
    state = StateDir(tmp_path / "state")
    _stage(state, "j1", contract)
    cache = InputCache.of_state(state.root)
    data = cache.data(_hex(contract, "repository"))
    modes = set()
    for folder, _dirs, names in os.walk(data):
        assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o555
        for name in names:
            st = os.lstat(Path(folder) / name)
            if stat.S_ISREG(st.st_mode):
                modes.add(stat.S_IMODE(st.st_mode))
    assert modes and modes <= {0o444, 0o555}
    assert stat.S_IMODE(os.lstat(cache.manifest(_hex(contract, "repository"))).st_mode) == 0o444


def test_the_working_copy_is_a_writable_copy_never_a_link_to_the_cache(tmp_path: Path) -> None:
    """workspace/repository is made from the linked input/: its files have one link each and
    other inodes, and writing all of them leaves every cached byte as it was."""
    contract = _pinned(tmp_path / "c")
    state = StateDir(tmp_path / "state")
    _stage(state, "j1", contract)
    job, done = _stage(state, "j2", contract)
    assert done.linked == [PAPER, REPO]
    assert layout.working_copy(job, contract, 1 << 40)
    cache = InputCache.of_state(state.root)
    data = cache.data(_hex(contract, "repository"))
    before = {k: (data / k).read_bytes() for k, st in _files(data).items()
              if stat.S_ISREG(st.st_mode)}  # fmt: skip
    work = job.workspace / "repository"
    for rel, st in _files(work).items():
        if not stat.S_ISREG(st.st_mode):
            continue
        assert st.st_nlink == 1 and st.st_ino != os.lstat(data / rel).st_ino
        assert st.st_mode & stat.S_IWUSR
        (work / rel).write_bytes(b"the job was here\n")
    assert {k: (data / k).read_bytes() for k in before} == before
    assert inputcache.verify(cache, remove=False) == {}


def test_a_contract_without_digests_is_copied_each_time_and_still_cached(tmp_path: Path) -> None:
    contract = load_contract(write_contract(tmp_path / "c", IMAGE))
    assert contract.model.repository is not None and contract.model.repository.digest is None
    state = StateDir(tmp_path / "state")
    first, done = _stage(state, "j1", contract)
    assert done.copied == [PAPER, REPO] and done.cached == [PAPER, REPO]
    _, done = _stage(state, "j2", contract)
    assert done.copied == [PAPER, REPO] and done.linked == [] and done.cached == []
    got = json.loads((first.record / "inputs.json").read_text())["inputs"]
    assert {u["digest"] for u in got} == {
        i["digest"] for i in json.loads((first.execution / "input-manifest.json").read_text())[
            "inputs"]}  # fmt: skip


def test_an_input_that_is_not_the_bound_one_is_refused_and_never_cached(tmp_path: Path) -> None:
    contract = _pinned(tmp_path / "c")
    (tmp_path / "c" / "paper.md").write_text("another paper\n")
    state = StateDir(tmp_path / "state")
    with pytest.raises(InputDigestMismatch):
        _stage(state, "j1", contract)
    cache = InputCache.of_state(state.root)
    assert _hex(contract, "paper") not in cache.hexes()
    assert len(cache.hexes()) == 0  # refused at the paper: the repository was never reached


def test_an_entry_edited_on_the_host_is_caught_removed_and_staged_from_the_source(
    tmp_path: Path,
) -> None:
    """Someone makes a cached file writable and edits it: the next job's lstat check sees it,
    removes the entry, copies from the source (verified), and caches that copy afresh."""
    contract = _pinned(tmp_path / "c")
    state = StateDir(tmp_path / "state")
    _stage(state, "j1", contract)
    cache = InputCache.of_state(state.root)
    paper = cache.data(_hex(contract, "paper"))
    os.chmod(paper, 0o644)
    with paper.open("ab") as f:
        f.write(b"tampered\n")
    os.chmod(paper, 0o444)
    job, done = _stage(state, "j2", contract)
    assert done.linked == [REPO] and done.copied == [PAPER] and done.cached == [PAPER]
    assert b"tampered" not in (job.input / "paper.md").read_bytes()
    assert (job.input / "paper.md").read_bytes() == (tmp_path / "c" / "paper.md").read_bytes()
    assert inputcache.verify(cache, remove=False) == {}


def test_a_tampered_entry_without_its_source_fails_staging_rather_than_use_it(
    tmp_path: Path,
) -> None:
    contract = _pinned(tmp_path / "c")
    state = StateDir(tmp_path / "state")
    _stage(state, "j1", contract)
    cache = InputCache.of_state(state.root)
    paper = cache.data(_hex(contract, "paper"))
    os.chmod(paper, 0o644)  # made writable: that alone fails the check
    (tmp_path / "c" / "paper.md").unlink()
    with pytest.raises(ContractError, match="does not exist"):
        _stage(state, "j2", contract)
    assert _hex(contract, "paper") not in cache.hexes()


def test_an_edit_that_keeps_size_and_time_is_caught_by_verify_and_on_link(
    tmp_path: Path,
) -> None:
    """An edit keeping the size and restoring the modification time (issue 25 item 4):
    `runner cache verify` names the file, and the next job's check on link sees the changed
    ctime, re-hashes the file, removes the entry and stages the input from its source."""
    contract = _pinned(tmp_path / "c")
    state = StateDir(tmp_path / "state")
    _stage(state, "j1", contract)
    cache = InputCache.of_state(state.root)
    paper = cache.data(_hex(contract, "paper"))
    st = os.lstat(paper)
    body = paper.read_bytes()
    os.chmod(paper, 0o644)
    paper.write_bytes(body[:-2] + b"!\n")
    os.chmod(paper, 0o444)
    os.utime(paper, ns=(st.st_atime_ns, st.st_mtime_ns))
    out = run_cli("cache", "verify", "--keep", "--state-dir", str(state.root), "--json")
    assert out.returncode == 1, out.stderr
    bad = json.loads(out.stdout)["bad"]
    assert [b["sha256"] for b in bad] == [f"sha256:{_hex(contract, 'paper')}"]
    assert "does not hash" in bad[0]["problem"]
    assert _hex(contract, "paper") in cache.hexes()  # --keep: only listed
    job, done = _stage(state, "j2", contract)
    assert done.linked == [REPO] and done.copied == [PAPER] and done.cached == [PAPER]
    assert (job.input / "paper.md").read_bytes() == (tmp_path / "c" / "paper.md").read_bytes()
    assert staging.recheck_inputs(job).unchanged is True
    assert run_cli("cache", "verify", "--state-dir", str(state.root)).returncode == 0


def test_a_manifest_whose_rows_leave_the_entry_is_never_followed(tmp_path: Path) -> None:
    """A manifest edited on the host (its listing left as it was, so it still hashes to its
    name) with a row outside the entry: the entry is unusable, the input is staged from its
    source, nothing is linked outside input/, and the entry is made again."""
    contract = _pinned(tmp_path / "c")
    state = StateDir(tmp_path / "state")
    _stage(state, "j1", contract)
    cache = InputCache.of_state(state.root)
    repo_hex = _hex(contract, "repository")
    path = cache.manifest(repo_hex)
    m = json.loads(path.read_text())
    first = next(r for r in m["entries"] if r["kind"] == "F")
    m["entries"].append({**first, "path": "../../../../escaped"})
    os.chmod(path, 0o644)
    path.write_text(json.dumps(m))
    assert cache.read_manifest(repo_hex) is None
    job, done = _stage(state, "j2", contract)
    assert done.copied == [REPO] and done.linked == [PAPER] and done.cached == [REPO]
    assert not any(p.name == "escaped" for p in tmp_path.rglob("escaped"))
    assert cache.read_manifest(repo_hex) is not None
    assert staging.recheck_inputs(job).unchanged is True


def test_two_jobs_staging_one_input_at_once_make_one_entry(tmp_path: Path) -> None:
    import threading

    contract = _pinned(tmp_path / "c")
    state = StateDir(tmp_path / "state")
    errors: list[Exception] = []

    def one(job_id: str) -> None:
        try:
            _stage(state, job_id, contract)
        except Exception as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(f"j{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    cache = InputCache.of_state(state.root)
    assert len(cache.hexes()) == 2 and list((cache.root / "tmp").iterdir()) == []
    for i in range(4):
        assert staging.recheck_inputs(state.job(f"j{i}")).unchanged is True
    assert inputcache.verify(cache, remove=False) == {}


def test_prepare_writable_never_hands_a_linked_file_to_the_job(tmp_path: Path) -> None:
    """Run as root, the runner chowns the writable folders to the job's user; a file there with
    a second link (one that could be a cached input's inode) keeps its owner. (Not as root,
    the job runs as the caller and nothing is chowned.)"""
    contract = _pinned(tmp_path / "c")
    state = StateDir(tmp_path / "state")
    job, _ = _stage(state, "j1", contract)
    cache = InputCache.of_state(state.root)
    cached = cache.data(_hex(contract, "paper"))
    os.link(cached, job.workspace / "linked.md")
    (job.workspace / "own.txt").write_text("mine\n")
    staging.prepare_writable(job, 54321, 54321, [])
    assert os.lstat(cached).st_uid == os.geteuid()
    expected = 54321 if os.geteuid() == 0 else os.geteuid()
    assert os.lstat(job.workspace / "own.txt").st_uid == expected


def test_the_host_caps_apply_to_inputs_placed_from_the_cache(tmp_path: Path) -> None:
    contract = _pinned(tmp_path / "c")
    state = StateDir(tmp_path / "state")
    _stage(state, "j1", contract)
    with pytest.raises(PolicyViolation, match="maxInputMb"):
        _stage(state, "j2", contract, InputRules(max_bytes=100))
    with pytest.raises(PolicyViolation, match="maxInputFiles"):
        _stage(state, "j3", contract, InputRules(max_files=3))


def test_another_file_system_falls_back_to_copies(tmp_path: Path) -> None:
    """A job folder on another file system than the cache (tmpfs here): link(2) fails with
    EXDEV; the entry is copied into input/ (other inodes, the same bytes), and a job staged
    there makes no entry."""
    shm = Path("/dev/shm")
    if not shm.is_dir():  # pragma: no cover - every Linux test host has one
        pytest.fail("/dev/shm is needed for a second file system")
    contract = _pinned(tmp_path / "c")
    state = StateDir(tmp_path / "state")
    _stage(state, "j1", contract)
    cache = InputCache.of_state(state.root)
    other = Path(os.environ.get("TMPDIR_SHM", shm)) / f"runner-test-{os.getpid()}-{id(tmp_path)}"
    try:
        job = staging.prepare(other / "job")
        done = inputcache.Staged([], [], [])
        staging.stage_inputs(job, contract, via=inputcache.stager(cache, job, done=done))
        assert done.linked == [PAPER, REPO]
        data = cache.data(_hex(contract, "paper"))
        here = job.input / "paper.md"
        assert here.read_bytes() == data.read_bytes()
        assert os.lstat(here).st_ino != os.lstat(data).st_ino
        assert staging.recheck_inputs(job).unchanged is True
        lonely = InputCache(other / "cache")
        job2 = staging.prepare(tmp_path / "job2")
        done = inputcache.Staged([], [], [])
        staging.stage_inputs(job2, contract, via=inputcache.stager(lonely, job2, done=done))
        assert done.copied == [PAPER, REPO] and done.cached == [] and lonely.hexes() == []
    finally:
        import shutil

        shutil.rmtree(other, ignore_errors=True)


def _finish(ledger: Path, job_id: str) -> None:
    from runner.state.ledger import Ledger

    led = Ledger.open(ledger)
    zero = "sha256:" + "0" * 64
    led.append("job.accepted", "job.accepted",
               {"jobId": job_id, "contractDigest": zero, "limitSeconds": 60})  # fmt: skip
    led.append("job.finished-0", "job.finished", {"status": "succeeded", "envelopeSha256": zero})


def test_prune_keeps_inputs_a_job_that_has_not_ended_uses_and_a_regrade_keeps_its_bytes(
    tmp_path: Path,
) -> None:
    contract = _pinned(tmp_path / "c")
    state = StateDir(tmp_path / "state")
    job, _ = _stage(state, "j1", contract)
    (job.record / "ledger.jsonl").write_text("")  # accepted, not ended
    cache = InputCache.of_state(state.root)
    assets = AssetCache.of_state(state.root)
    listed = entries(assets, state, cache)
    assert {e.cache for e in listed} == {"input"} and len(listed) == 2
    assert all(e.users == ["j1"] for e in listed)
    assert {i for e in listed for i in e.ids} == {"paper.md", "repository"}
    done = prune(assets, state, inputs=cache)
    assert done.removed == [] and len(done.kept_in_use) == 2
    assert len(cache.hexes()) == 2
    before = (job.input / "paper.md").read_bytes()
    _finish(job.ledger, "j1")
    done = prune(assets, state, inputs=cache)
    assert len(done.removed) == 2 and cache.hexes() == []
    assert (job.input / "paper.md").read_bytes() == before  # the job's own link
    assert staging.recheck_inputs(job).unchanged is True


def test_prune_removes_what_a_killed_runner_left_in_tmp(tmp_path: Path) -> None:
    """A runner killed while making an entry leaves ``tmp/<hex>.<random>/`` (read-only
    folders inside); prune removes it, but not while the digest's lock is held."""
    contract = _pinned(tmp_path / "c")
    state = StateDir(tmp_path / "state")
    job, _ = _stage(state, "j1", contract)
    _finish(job.ledger, "j1")
    cache = InputCache.of_state(state.root)
    hexd = "ab" * 32
    left = cache.root / "tmp" / f"{hexd}.deadbeef"
    (left / "data" / "sub").mkdir(parents=True)
    (left / "data" / "sub" / "f").write_text("x")
    os.chmod(left / "data" / "sub", 0o555)  # noqa: S103 - as an entry being made has it
    with cache.locked(hexd):
        prune(AssetCache.of_state(state.root), state, inputs=cache, older_than=10**9)
        assert left.exists()  # another runner may still be making it
    prune(AssetCache.of_state(state.root), state, inputs=cache, older_than=10**9)
    assert not left.exists()
    assert len(cache.hexes()) == 2  # older_than: nothing else removed


def test_runner_cache_ls_and_prune_list_input_entries(tmp_path: Path) -> None:
    contract = _pinned(tmp_path / "c")
    state = StateDir(tmp_path / "state")
    _stage(state, "j1", contract)
    _finish(state.job("j1").ledger, "j1")
    out = run_cli("cache", "ls", "--state-dir", str(state.root), "--json")
    assert out.returncode == 0, out.stderr
    listed: list[dict[str, Any]] = json.loads(out.stdout)["entries"]
    assert {e["cache"] for e in listed} == {"input"}
    assert {e["sha256"] for e in listed} == {
        str(contract.model.paper.digest) if contract.model.paper else "",
        str(contract.model.repository.digest) if contract.model.repository else "",
    }
    text = run_cli("cache", "ls", "--state-dir", str(state.root))
    assert "0 asset(s) and 2 input(s)" in text.stdout
    pruned = run_cli("cache", "prune", "--state-dir", str(state.root), "--json")
    assert pruned.returncode == 0, pruned.stderr
    assert len(json.loads(pruned.stdout)["removed"]) == 2
    assert InputCache.of_state(state.root).hexes() == []
