"""Assets fetched on the host (issue 16): the contract's asset fields, the host policy's
grant, downloads from a loopback server (Range resumes, retries, wrong bytes, 4xx, one
download for two runners), the cache's listing and prune. Containers:
tests/integration/test_assets_docker.py.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from runner.caches.assetcache import entries, in_use, prune
from runner.caches.assets import AssetCache, fetch, stage
from runner.caches.download import Download
from runner.contract import load_contract, with_digest
from runner.contract.load import Trust
from runner.contract.models import Asset
from runner.core.errors import AssetDigestMismatch, AssetUnavailable, ContractError
from runner.planning.policy import AssetGrant
from runner.staging.jobdir import prepare
from runner.state.jobdir import StateDir
from tests.support import FAKE_IMAGE_ID, ROOT, cli, run_cli, write_contract
from tests.support.asset_server import AssetServer, Served, asset_server
from tests.support.clock import VirtualClock

BODY = os.urandom(3 * 1024 * 1024 + 17)
DIGEST = "sha256:" + hashlib.sha256(BODY).hexdigest()


def asset(url: str, body: bytes = BODY, **extra: Any) -> dict[str, Any]:
    return {
        "id": "data",
        "sources": [url],
        "sha256": "sha256:" + hashlib.sha256(body).hexdigest(),
        "size": len(body),
        "path": "data/blob.bin",
        **extra,
    }


def model(data: dict[str, Any]) -> Asset:
    return Asset.model_validate(data)


def grant(**changes: Any) -> AssetGrant:
    return AssetGrant(allowHosts=["127.0.0.1"], **changes)


@pytest.fixture
def server() -> Any:
    with asset_server() as s:
        yield s


def cache_of(tmp_path: Path) -> AssetCache:
    return AssetCache.of_state(tmp_path / "state")


# ---------------------------------------------------------------- the contract and policy


def contract_with(tmp_path: Path, assets: Any) -> Path:
    def change(data: dict[str, Any]) -> None:
        data["assets"] = assets

    return write_contract(tmp_path, FAKE_IMAGE_ID, with_inputs=False, change=change)


def test_an_asset_is_validated_field_by_field_with_json_paths(tmp_path: Path) -> None:
    """Bad fields are refused naming their JSON path: a scheme other than http(s), a URL with
    credentials, a path that climbs out, a digest without its prefix, an unknown field."""
    bad = {
        "id": "x",
        "sources": ["ftp://h/x", "https://u:p@h/x"],
        "sha256": "0" * 64,
        "size": 1,
        "path": "../x",
        "unpak": "tar",
    }
    with pytest.raises(ContractError) as err:
        load_contract(contract_with(tmp_path, [bad]), Trust(keys=[]))
    text = str(err.value)
    for where in (
        "$.assets[0].sources[0]",
        "$.assets[0].sources[1]",
        "$.assets[0].sha256",
        "$.assets[0].path",
        "$.assets[0].unpak",
    ):
        assert where in text, text
    assert "credentials" in text


def test_two_assets_on_one_path_or_one_id_are_refused(tmp_path: Path) -> None:
    """Asset ids are unique and no asset's path lies inside another's."""
    a = asset("http://127.0.0.1/a", path="data")
    b = {**asset("http://127.0.0.1/b"), "id": "other", "path": "data/inner"}
    with pytest.raises(ContractError, match=r"\$\.assets: asset 'other': path 'data/inner'"):
        load_contract(contract_with(tmp_path, [a, b]), Trust(keys=[]))
    with pytest.raises(ContractError, match="asset id 'data' appears twice"):
        load_contract(contract_with(tmp_path, [a, {**a, "path": "x"}]), Trust(keys=[]))


def test_a_legacy_asset_entry_is_carried_and_not_fetched(tmp_path: Path) -> None:
    """An entry with none of the fetched fields (the seed's id + acquisition) is carried."""
    legacy = {"id": "labels", "acquisition": {"requiredPaths": ["labels.txt"]}, "any": 1}
    loaded = load_contract(contract_with(tmp_path, [legacy]), Trust(keys=[]))
    assert loaded.model.fetched_assets == []
    assert loaded.data["assets"] == [legacy]


def test_the_asset_fields_are_covered_by_the_contract_digest(tmp_path: Path) -> None:
    """Changing an asset's sha256 without a new contractDigest is refused."""
    path = contract_with(tmp_path, [asset("http://127.0.0.1/a")])
    data = json.loads(path.read_text())
    data["assets"][0]["sha256"] = "sha256:" + "1" * 64
    path.write_text(json.dumps(data))
    with pytest.raises(ContractError, match="contractDigest"):
        load_contract(path, Trust(keys=[]))
    path.write_text(json.dumps(with_digest(data)))
    assert load_contract(path, Trust(keys=[])).model.fetched_assets[0].sha256.endswith("1" * 64)


def test_the_policy_grants_hosts_by_name_and_port() -> None:
    g = AssetGrant(allowHosts=["data.example.org", "127.0.0.1:8080", "[::1]:9000"])
    assert g.allows("DATA.example.org", 443)
    assert g.allows("127.0.0.1", 8080)
    assert not g.allows("127.0.0.1", 8081)
    assert g.allows("::1", 9000)
    assert not g.allows("evil.example.org", 443)
    assert AssetGrant(allowHosts=["*"]).allows("anything", 1)
    assert not AssetGrant().allows("127.0.0.1", 80)


# ---------------------------------------------------------------- fetching


def test_fetch_downloads_verifies_and_caches_read_only(tmp_path: Path, server: AssetServer) -> None:
    """The bytes land under their digest, 0444, and a second fetch downloads nothing."""
    server.files["blob"] = Served(BODY)
    cache = cache_of(tmp_path)
    a = model(asset(server.url("blob")))
    got = fetch(a, tmp_path, cache, grant())
    assert not got.cached and got.downloaded == len(BODY)
    blob = cache.blob(DIGEST.removeprefix("sha256:"))
    assert blob.read_bytes() == BODY
    assert blob.stat().st_mode & 0o777 == 0o444
    again = fetch(a, tmp_path, cache, grant())
    assert again.cached and again.downloaded == 0
    assert server.gets("blob") == 1
    assert not list((cache.root / "partial").iterdir())


def test_wrong_bytes_are_refused_naming_both_digests_and_nothing_is_cached(
    tmp_path: Path, server: AssetServer
) -> None:
    """A source that sends other bytes: asset_digest_mismatch, the asset and both digests."""
    other = os.urandom(len(BODY))
    server.files["blob"] = Served(other)
    cache = cache_of(tmp_path)
    with pytest.raises(AssetDigestMismatch) as err:
        fetch(model(asset(server.url("blob"))), tmp_path, cache, grant())
    text = str(err.value)
    assert "'data'" in text and DIGEST in text
    assert "sha256:" + hashlib.sha256(other).hexdigest() in text
    assert err.value.category == "asset_digest_mismatch"
    assert not any(p.is_file() for p in cache.root.rglob("*") if "locks" not in p.parts)


def test_a_source_sending_too_much_is_cut_off_and_refused(
    tmp_path: Path, server: AssetServer
) -> None:
    server.files["blob"] = Served(BODY + b"more")
    with pytest.raises(AssetDigestMismatch, match="sends more than"):
        fetch(model(asset(server.url("blob"))), tmp_path, cache_of(tmp_path), grant())


def test_a_404_is_a_clear_error_at_once_without_retries(
    tmp_path: Path, server: AssetServer
) -> None:
    server.files["blob"] = Served(BODY, status=404)
    since = time.monotonic()
    with pytest.raises(AssetUnavailable, match="answered 404") as err:
        fetch(model(asset(server.url("blob"))), tmp_path, cache_of(tmp_path), grant(retries=5))
    assert time.monotonic() - since < 2
    assert server.gets("blob") == 1
    assert "'data'" in str(err.value)


def test_503_twice_then_200_succeeds(
    tmp_path: Path, server: AssetServer, virtual_clock: VirtualClock
) -> None:
    server.files["blob"] = Served(BODY, fail_first=2)
    got = fetch(model(asset(server.url("blob"))), tmp_path, cache_of(tmp_path), grant())
    assert got.downloaded == len(BODY)
    assert server.gets("blob") == 3
    assert virtual_clock.sleeps == [0.25, 0.5]  # the exponential backoff between the tries


def test_503_past_the_retries_gives_up(tmp_path: Path, server: AssetServer) -> None:
    server.files["blob"] = Served(BODY, fail_first=10)
    with pytest.raises(AssetUnavailable, match="503"):
        fetch(model(asset(server.url("blob"))), tmp_path, cache_of(tmp_path), grant(retries=1))
    assert server.gets("blob") == 2


def test_a_broken_connection_is_resumed_with_a_range(tmp_path: Path, server: AssetServer) -> None:
    """The connection drops after 1 MiB; the retry asks for the rest only."""
    server.files["blob"] = Served(BODY, cut_after=1024 * 1024)
    got = fetch(model(asset(server.url("blob"))), tmp_path, cache_of(tmp_path), grant())
    assert got.downloaded == len(BODY)
    assert server.log.requests[1] == ("blob", f"bytes={1024 * 1024}-")
    assert server.log.sent[1] == len(BODY) - 1024 * 1024


def test_a_host_the_policy_does_not_name_is_never_asked(
    tmp_path: Path, server: AssetServer
) -> None:
    server.files["blob"] = Served(BODY)
    with pytest.raises(AssetUnavailable, match=r"not in the host policy's assets\.allowHosts"):
        fetch(model(asset(server.url("blob"))), tmp_path, cache_of(tmp_path), AssetGrant())
    assert server.log.requests == []


def test_a_redirect_to_a_host_the_policy_does_not_name_is_not_followed(
    tmp_path: Path, server: AssetServer
) -> None:
    server.files["blob"] = Served(BODY, redirect_to="http://localhost:1/elsewhere")
    with pytest.raises(AssetUnavailable, match="localhost:1 is not in"):
        fetch(model(asset(server.url("blob"))), tmp_path, cache_of(tmp_path), grant())


def test_the_next_source_is_tried_when_one_fails(tmp_path: Path, server: AssetServer) -> None:
    server.files["good"] = Served(BODY)
    a = model({**asset(server.url("missing")), "sources": [server.url("missing"),
                                                           server.url("good")]})  # fmt: skip
    got = fetch(a, tmp_path, cache_of(tmp_path), grant())
    assert got.source == server.url("good")


def test_a_local_source_beside_the_contract_is_read_without_following_links(
    tmp_path: Path,
) -> None:
    (tmp_path / "data.bin").write_bytes(BODY)
    (tmp_path / "link.bin").symlink_to(tmp_path / "data.bin")
    got = fetch(model(asset("data.bin")), tmp_path, cache_of(tmp_path), AssetGrant())
    assert got.downloaded == len(BODY)
    with pytest.raises(AssetUnavailable, match=r"link\.bin"):
        fetch(model(asset("link.bin", body=BODY[:10])), tmp_path, cache_of(tmp_path), grant())


def test_the_cache_size_limit_refuses_a_fetch_that_would_pass_it(
    tmp_path: Path, server: AssetServer
) -> None:
    server.files["blob"] = Served(BODY)
    with pytest.raises(AssetUnavailable, match="cacheMaxBytes"):
        fetch(
            model(asset(server.url("blob"))), tmp_path, cache_of(tmp_path),
            grant(cacheMaxBytes=len(BODY) - 1),
        )  # fmt: skip
    assert server.log.requests == []


def test_two_concurrent_fetches_download_once(tmp_path: Path, server: AssetServer) -> None:
    """Two runners (processes) ask for the same asset at once: one GET, both succeed."""
    server.files["blob"] = Served(BODY, delay_per_chunk=0.03)  # about 1.5 s: the two overlap
    path = contract_with(tmp_path, [asset(server.url("blob"))])
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"acceptUnsigned": True, "assets": {"allowHosts": ["127.0.0.1"]}}))
    args = ["fetch", str(path), "--policy", str(policy), "--state-dir", str(tmp_path / "state"),
            "--json"]  # fmt: skip
    procs = [cli.popen(args, env=dict(os.environ)) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    reports = [json.loads(o[0]) for o in outs]
    assert sorted(r["assets"][0]["cached"] for r in reports) == [False, True]
    assert server.gets("blob") == 1


def test_a_killed_fetch_resumes_where_it_stopped(tmp_path: Path, server: AssetServer) -> None:
    """`runner fetch` is SIGKILLed mid-download; the next one asks for the rest (a Range
    request) and the server sends fewer bytes than the whole."""
    server.files["blob"] = Served(BODY, delay_per_chunk=0.02)
    path = contract_with(tmp_path, [asset(server.url("blob"))])
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"acceptUnsigned": True, "assets": {"allowHosts": ["127.0.0.1"]}}))
    state = tmp_path / "state"
    args = ["fetch", str(path), "--policy", str(policy), "--state-dir", str(state), "--json"]
    proc = cli.popen(args, env=dict(os.environ))
    partial = AssetCache.of_state(state).partial(DIGEST.removeprefix("sha256:"))
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size > len(BODY) // 3):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    kept = partial.stat().st_size
    assert 0 < kept < len(BODY)
    server.files["blob"].delay_per_chunk = 0
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["assets"][0]
    assert report["downloadedBytes"] == len(BODY) - kept
    assert server.log.requests[-1] == ("blob", f"bytes={kept}-")
    assert server.log.sent[-1] == len(BODY) - kept < len(BODY)
    assert AssetCache.of_state(state).blob(DIGEST.removeprefix("sha256:")).read_bytes() == BODY


def test_fetch_shows_progress_on_stderr_and_never_under_json(
    tmp_path: Path, server: AssetServer
) -> None:
    """For people, the run's progress line on stderr (a line, stderr not being a terminal)
    and one line an asset on stdout; under --json, stdout is the report alone, no progress."""
    server.files["blob"] = Served(BODY)
    path = contract_with(tmp_path, [asset(server.url("blob"))])
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"acceptUnsigned": True, "assets": {"allowHosts": ["127.0.0.1"]}}))
    args = ["fetch", str(path), "--policy", str(policy)]
    people = run_cli(*args, "--state-dir", str(tmp_path / "a"))
    assert people.returncode == 0, people.stderr
    assert "    fetching data: " in people.stderr and " MiB" in people.stderr
    assert "fetching data" not in people.stdout and "-> /job/assets/data/blob.bin" in people.stdout
    machine = run_cli(*args, "--state-dir", str(tmp_path / "b"), "--json")
    assert machine.returncode == 0, machine.stderr
    assert json.loads(machine.stdout)["assets"][0]["cached"] is False
    assert "fetching" not in machine.stderr


# ---------------------------------------------------------------- the cache


def test_prune_never_removes_an_asset_a_job_that_has_not_ended_uses(tmp_path: Path) -> None:
    """Two cached assets; a job that has not ended uses one: prune removes only the other,
    and once the job has ended, that one too."""
    (tmp_path / "a.bin").write_bytes(b"a" * 100)
    (tmp_path / "b.bin").write_bytes(b"b" * 200)
    a = asset("a.bin", body=b"a" * 100)
    b = {**asset("b.bin", body=b"b" * 200), "id": "b", "path": "b.bin"}
    path = contract_with(tmp_path, [a, b])
    state = StateDir(tmp_path / "state")
    cache = AssetCache.of_state(state.root)
    contract = load_contract(path, Trust(keys=[]))
    for x in contract.model.fetched_assets:
        fetch(x, tmp_path, cache, AssetGrant())
    job = prepare(state.job("j1").root)
    (job.record / "ledger.jsonl").write_text("")
    (tmp_path / "x").mkdir()
    only_a = load_contract(contract_with(tmp_path / "x", [a]), Trust(keys=[]))
    stage(job, only_a, cache, AssetGrant())
    a_hex = a["sha256"].removeprefix("sha256:")
    b_hex = b["sha256"].removeprefix("sha256:")
    assert in_use(state) == {a_hex: ["j1"]}
    done = prune(cache, state)
    assert [e.sha256 for e in done.removed] == [b_hex]
    assert [e.sha256 for e in done.kept_in_use] == [a_hex]
    assert cache.blob(a_hex).exists() and not cache.blob(b_hex).exists()
    _finish(job.record / "ledger.jsonl")
    assert [e.sha256 for e in prune(cache, state).removed] == [a_hex]
    assert entries(cache) == []


def test_a_job_waits_on_another_runners_fetch_only_so_long(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """Another runner holds the asset's lock (a fetch that does not end): stage gives up after
    its lock timeout with asset_unavailable naming the asset, whether it may fetch or not."""
    (tmp_path / "a.bin").write_bytes(b"a" * 100)
    a = asset("a.bin", body=b"a" * 100)
    contract = load_contract(contract_with(tmp_path, [a]), Trust(keys=[]))
    cache = cache_of(tmp_path)
    job = prepare(StateDir(tmp_path / "state").job("j1").root)
    with cache.locked(a["sha256"].removeprefix("sha256:")) as held:
        assert held
        for fetch_on_run in (True, False):
            since = virtual_clock.elapsed
            with pytest.raises(AssetUnavailable, match="another runner has been fetching it"):
                stage(job, contract, cache, AssetGrant(fetchOnRun=fetch_on_run), lock_timeout=0.5)
            assert 0.5 - 1e-9 <= virtual_clock.elapsed - since <= 0.5 + 0.2 + 1e-9  # a poll more
    assert stage(job, contract, cache, AssetGrant(fetchOnRun=True), lock_timeout=0.5)


def _finish(ledger: Path) -> None:
    from runner.state.ledger import Ledger

    led = Ledger.open(ledger)
    zero = "sha256:" + "0" * 64
    led.append("job.accepted", "job.accepted",
               {"jobId": "j1", "contractDigest": zero, "limitSeconds": 60})  # fmt: skip
    led.append("job.finished-0", "job.finished", {"status": "succeeded", "envelopeSha256": zero})


def test_prune_by_size_and_age_removes_least_recently_used_first(tmp_path: Path) -> None:
    cache = cache_of(tmp_path)
    state = StateDir(tmp_path / "state")
    bodies = [bytes([i]) * 1000 for i in range(3)]
    for i, body in enumerate(bodies):
        (tmp_path / f"{i}.bin").write_bytes(body)
        fetch(model({**asset(f"{i}.bin", body=body), "id": f"a{i}"}), tmp_path, cache,
              AssetGrant())  # fmt: skip
        meta = cache.meta(hashlib.sha256(body).hexdigest())
        data = json.loads(meta.read_text())
        data["lastUsedAt"] = f"2026-01-0{i + 1}T00:00:00+00:00"
        meta.write_text(json.dumps(data))
        for f in (cache.blob(hashlib.sha256(body).hexdigest()), meta):
            os.utime(f, (0, 0), follow_symlinks=False)
    assert [e.ids for e in entries(cache)] == [["a0"], ["a1"], ["a2"]]
    done = prune(cache, state, max_bytes=2000)
    assert [e.ids for e in done.removed] == [["a0"]] and done.left_bytes == 2000
    now = entries(cache)[-1].last_used + 3600
    assert prune(cache, state, older_than=2 * 86400, now=now).removed == []
    assert [e.ids for e in prune(cache, state, older_than=60, now=now).removed] == [["a1"], ["a2"]]


def test_runner_cache_ls_and_prune_on_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"a" * 100)
    state = tmp_path / "state"
    fetch(model(asset("a.bin", body=b"a" * 100)), tmp_path, AssetCache.of_state(state),
          AssetGrant())  # fmt: skip
    listed = run_cli("cache", "ls", "--state-dir", str(state), "--json")
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)["entries"]
    assert entry["bytes"] == 100 and entry["ids"] == ["data"] and entry["inUseBy"] == []
    pruned = run_cli("cache", "prune", "--state-dir", str(state), "--max-bytes", "0", "--json")
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["removedBytes"] == 100
    assert json.loads(run_cli("cache", "ls", "--state-dir", str(state), "--json").stdout) == {
        "entries": [],
        "totalBytes": 0,
    }


def test_threads_in_one_process_also_download_once(tmp_path: Path, server: AssetServer) -> None:
    """flock is per open file: two threads of one runner (runner serve) wait on each other."""
    server.files["blob"] = Served(BODY, delay_per_chunk=0.005)
    cache = cache_of(tmp_path)
    a = model(asset(server.url("blob")))
    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(fetch(a, tmp_path, cache, grant())))
               for _ in range(2)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(r.cached for r in results) == [False, True]
    assert server.gets("blob") == 1


def test_the_example_contract_fetches_from_the_serve_script(tmp_path: Path) -> None:
    """examples/asset-evaluation: its asset is the served file (digest and size), and
    scripts/serve_assets.py answers ranges, so a fetch from it resumes like any source."""
    import importlib.util
    from http.server import ThreadingHTTPServer

    import requests

    example = ROOT / "examples" / "asset-evaluation"
    loaded = load_contract(example / "task.json", Trust(keys=[]))
    (a,) = loaded.model.fetched_assets
    served = (example / "served" / a.path).read_bytes()
    assert a.sha256 == "sha256:" + hashlib.sha256(served).hexdigest() and a.size == len(served)
    spec = importlib.util.spec_from_file_location(
        "serve_assets", ROOT / "scripts" / "serve_assets.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), module.make_handler(example / "served"))
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        part = requests.get(f"{base}/labels.txt", headers={"Range": "bytes=10-"}, timeout=10)
        assert part.status_code == 206 and part.content == served[10:]
        assert requests.get(f"{base}/../task.json", timeout=10).status_code == 404
        cache = cache_of(tmp_path)
        partial = cache.partial(a.sha256.removeprefix("sha256:"))
        partial.parent.mkdir(parents=True)
        local = a.model_copy(update={"sources": [f"{base}/labels.txt"]})
        Download(local, partial, None).begin(local.sources[0])  # as a killed fetch leaves it:
        partial.write_bytes(served[:100])  # the first bytes, and the source they came from
        got = fetch(local, tmp_path, cache, grant())
        assert got.downloaded == len(served) - 100
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_json_schema_agrees_with_the_models_on_assets() -> None:
    """contracts/execution-contract.schema.json (python-jsonschema, an independent validator)
    accepts a fetched asset and a legacy entry, and refuses a fetched asset missing a field,
    as the models do."""
    import jsonschema

    schema = json.loads((ROOT / "contracts" / "execution-contract.schema.json").read_text())
    check = jsonschema.Draft202012Validator(schema)
    data = json.loads((ROOT / "examples" / "asset-evaluation" / "task.json").read_text())
    assert list(check.iter_errors(data)) == []
    legacy = {**data, "assets": [{"id": "labels", "acquisition": {"requiredPaths": ["x"]}}]}
    assert list(check.iter_errors(legacy)) == []
    broken = {**data, "assets": [{k: v for k, v in data["assets"][0].items() if k != "size"}]}
    assert list(check.iter_errors(broken)) != []


def test_runner_verify_lists_the_assets() -> None:
    contract = ROOT / "examples" / "asset-evaluation" / "task.json"
    proc = run_cli("verify", str(contract), "--policy", str(contract.with_name("policy.json")))
    assert proc.returncode == 0, proc.stderr
    assert "asset           toy-labels (sha256:3a6cbf0c4402…, 1,001 bytes) at " in proc.stdout


def test_a_resumed_write_hashes_every_byte_and_starts_writeback_past_the_old_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes appended to a partial file are hashed (on the hashing thread) on top of the
    ones it held, and the writeback started every WRITEBACK_BYTES covers the new bytes, at
    their offsets in the file, not the old ones again."""
    from runner.caches import download

    body = os.urandom(10_000)
    a = Asset.model_validate(asset("http://127.0.0.1:1/x", body))
    partial = tmp_path / "x.partial"
    partial.write_bytes(body[:3_000])
    started: list[tuple[int, int]] = []
    monkeypatch.setattr(download, "WRITEBACK_BYTES", 1_000)
    monkeypatch.setattr(download, "_start_writeback", lambda _fd, at, n: started.append((at, n)))
    d = Download(a, partial, None)
    assert d.have() == 3_000
    d.write_from(iter([body[i : i + 700] for i in range(3_000, 10_000, 700)]), "ab")
    d.finish()  # raises WrongBytes unless the digest and size are the contract's
    assert started[0][0] == 3_000
    assert all(at + n == nxt for (at, n), (nxt, _) in itertools.pairwise(started))
    assert started[-1][0] + started[-1][1] > 9_000
