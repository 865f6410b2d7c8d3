"""The fifteenth hostile review: work a hostile input multiplies. A DSSE envelope of
thousands of made-up signatures had each tried against every trusted key over the whole
payload (3,000 of them took 2.8 s against 3 keys); a contract's preflight check ids were each
counted over the whole list, and its workload groups looked up in a list, once per group and
once per entry of the job's result.json (n squared: 80,000 checks took 72 s)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from runner.core.errors import SignatureInvalid
from runner.trust import signing
from tests.unit.test_signing import Host, b64, contract_data, independent_envelope

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def deep_tmp(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path``, emptied by the runner's own remove_tree: pytest's clean-up of an old
    session's folders recurses (shutil.rmtree on 3.11), and a tree this file makes may be
    deeper than it can."""
    from runner.core import archives

    yield tmp_path
    for child in list(tmp_path.iterdir()):
        archives.remove_tree(child)


def _with_few_descriptors(limit: int, code: str, *argv: str) -> str:
    """What ``code`` prints, run in a fresh interpreter held to ``limit`` open descriptors
    (``sys.argv[1:]`` is ``argv``)."""
    import subprocess
    import sys

    script = (
        "import resource, sys\nfrom pathlib import Path\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, "
        "resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n" + code
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _padded(envelope: dict[str, Any], count: int) -> dict[str, Any]:
    """The envelope with made-up signatures after its real one, ``count`` in all."""
    fake = {"keyid": "made-up", "sig": b64(bytes(64))}
    return {**envelope, "signatures": [*envelope["signatures"], *[fake] * (count - 1)]}


def test_an_envelope_of_thousands_of_signatures_is_refused_before_any_is_tried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    issuer = Ed25519PrivateKey.generate()
    trusted = [
        signing.TrustedKey(signing.key_id(k.public_key()), k.public_key(), "k")
        for k in (issuer, *(Ed25519PrivateKey.generate() for _ in range(2)))
    ]
    envelope = _padded(independent_envelope(contract_data(), issuer), 40_000)
    tried = 0
    real = signing.TrustedKey.named_by

    def counted(self: signing.TrustedKey, hint: object) -> bool:
        nonlocal tried
        tried += 1
        return real(self, hint)

    monkeypatch.setattr(signing.TrustedKey, "named_by", counted)
    t = time.process_time()
    with pytest.raises(SignatureInvalid) as refused:
        signing.verify_envelope(envelope, trusted, 1)
    assert time.process_time() - t < 1.0  # the loop alone took seconds
    assert tried == 0
    assert "carries 40000 signatures; at most 16 are read" in refused.value.message
    assert "signatureThreshold" in (refused.value.hint or "")


def test_up_to_the_cap_or_the_threshold_still_verifies() -> None:
    issuer = Ed25519PrivateKey.generate()
    trusted = [signing.TrustedKey(signing.key_id(issuer.public_key()), issuer.public_key(), "k")]
    envelope = independent_envelope(contract_data(), issuer)
    assert signing.verify_envelope(_padded(envelope, signing.MAX_SIGNATURES), trusted, 1)
    with pytest.raises(SignatureInvalid, match="at most 16 are read"):
        signing.verify_envelope(_padded(envelope, signing.MAX_SIGNATURES + 1), trusted, 1)
    # A host whose policy asks for more signers than the cap reads as many as it asks for.
    with pytest.raises(SignatureInvalid, match="1 distinct trusted key"):
        signing.verify_envelope(_padded(envelope, 20), trusted, 20)


def test_runner_verify_says_so_with_the_fix(tmp_path: Any) -> None:
    issuer = Ed25519PrivateKey.generate()
    host = Host(tmp_path / "host")
    host.trust(issuer)
    code, _, err = host.verify(_padded(independent_envelope(contract_data(), issuer), 5_000))
    assert code == 3
    assert "signature_invalid" in err
    assert "carries 5000 signatures; at most 16 are read" in err
    assert "fix:" in err


def test_a_contract_of_many_preflight_checks_is_checked_in_linear_time() -> None:
    """Each check's id was counted over the whole list (`ids.count`): 20,000 checks (a 278 KB
    contract) took 4 s, 80,000 took 72 s."""
    from runner.contract.models import Preflight

    checks = [{"id": f"check-{i}"} for i in range(80_000)]
    t = time.process_time()
    Preflight.model_validate({"checks": checks})
    assert time.process_time() - t < 5.0
    with pytest.raises(ValueError, match=r"'check-7' appear twice"):
        Preflight.model_validate({"checks": [*checks, {"id": "check-7"}]})


def test_a_contract_of_many_workload_groups_is_looked_up_in_linear_time() -> None:
    """The contract's group ids were kept in a list: each id found was looked for in it, and each
    of the job's workloadCompletion entries too (80,000 groups took 31 s)."""
    from runner.evidence import selfreport

    groups = [{"groupId": f"g{i}"} for i in range(80_000)]
    contract = {"protocol": {"workload": {"groups": [*groups, {"groupId": "g5"}]}}}
    t = time.process_time()
    found = selfreport._contract_groups(contract)
    assert time.process_time() - t < 2.0
    assert found is not None
    assert found[:3] == ["g0", "g1", "g2"]
    assert len(found) == 80_000  # each once, in order


def test_a_result_of_many_workload_entries_is_checked_in_linear_time(tmp_path: Any) -> None:
    """Each of the job's workloadCompletion entries was looked for in the contract's list of
    groups: entries times groups (12,000 entries of a 0.7 MB result.json against 60,000 groups
    took seconds)."""
    from tests.unit.test_selfreport import CONTRACT, GOOD, _read

    groups = [{"groupId": f"g{i}"} for i in range(60_000)]
    contract = {**CONTRACT, "protocol": {"workload": {"groups": groups}}}
    entries = [  # the last groups: each one found at the far end of the list
        {"groupId": f"g{i}", "units": 1, "evidencePath": "raw/eval.csv"}
        for i in range(48_000, 60_000)
    ]
    t = time.process_time()
    record = _read(tmp_path, {**GOOD, "workloadCompletion": entries}, contract=contract)
    assert time.process_time() - t < 3.0
    assert {f.code for f in record.flags} == {"workload_group_missing"}  # none unknown
    assert record.problems == ["47,800 more flags than the 200 recorded"]


def _ladder(root: Any, levels: int, *, with_files: bool = True) -> int:
    """A chain of folders ``levels`` deep under ``root``, each with a sibling folder holding a
    64 KiB file (left for later by a depth-first walk); the bytes allocated in it all."""
    import os

    os.makedirs(root)
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(levels):
            os.mkdir("b", dir_fd=fd)
            if with_files:
                side = os.open("b", os.O_RDONLY, dir_fd=fd)
                out = os.open("big", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=side)
                os.write(out, b"x" * 65536)
                os.close(out)
                os.close(side)
            os.mkdir("a", dir_fd=fd)
            deeper = os.open("a", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = deeper
    finally:
        os.close(fd)
    total, stack = 0, [str(root)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                total += e.stat(follow_symlinks=False).st_blocks * 512
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
    return total


def test_the_disk_meter_counts_a_deep_ladder_with_few_descriptors(deep_tmp: Path) -> None:
    """A walk that opened every folder it found before entering any held one descriptor a
    level: under a limit of 128 it counted nothing past the 128th (a job hid its files from
    the quota so, and the runner's own opens failed meanwhile)."""
    from runner.execution import quotas

    expected = _ladder(deep_tmp / "out", quotas.MAX_DEPTH - 1)
    code = (
        "from runner.execution.quotas import allocated_bytes\n"
        "print(allocated_bytes([Path(sys.argv[1])]))\n"
    )
    assert int(_with_few_descriptors(64 + 256 + 8, code, str(deep_tmp / "out"))) == expected


def test_a_folder_nested_past_the_meters_depth_stops_the_job_as_over_its_quota(
    deep_tmp: Path,
) -> None:
    from runner.execution import quotas

    _ladder(deep_tmp / "out", quotas.MAX_DEPTH + 5, with_files=False)
    with pytest.raises(quotas.TooDeep):
        quotas.allocated_bytes([deep_tmp / "out"])
    meter = quotas.DiskMeter([deep_tmp / "out"], quota=10 * 2**30)
    guards = quotas.Guards(disk=meter, logs=[], stop_on_log_limit=False)
    assert guards.check() == "disk_quota_exceeded"
    assert meter.unmeasured == f"a folder is nested more than {quotas.MAX_DEPTH} deep"
    assert meter.last == meter.quota + 1
    assert guards.breached() == "disk_quota_exceeded"


def _chain(root: Path, levels: int, name: str = "a") -> Path:
    """``root``/a/a/... ``levels`` deep (made through descriptors: past PATH_MAX too); a file
    ``leaf`` in each of the first and the last folders."""
    import os

    root.mkdir(parents=True, exist_ok=True)
    (root / "leaf").write_text("top")
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(levels):
            os.mkdir(name, dir_fd=fd)
            deeper = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        out = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.close(out)
    finally:
        os.close(fd)
    return root


def test_a_tree_a_thousand_deep_is_walked_by_the_manifest_and_the_next_staging(
    deep_tmp: Path,
) -> None:
    """os.walk recursed: the output manifest of a job that left output/a/a/... 1,200 deep
    raised RecursionError in the parsers stage (the run's measurements lost, the failure
    taken for the host's), and the next attempt's staging, which hands output/ and workspace/
    to the job's user, did the same."""
    import os

    from runner.core import archives
    from runner.execution import records
    from runner.staging.jobdir import prepare, prepare_writable

    job = prepare(deep_tmp / "job")
    try:
        _chain(job.output, 1_200)
        _chain(job.workspace, 3_000, name="b" * 200)  # past PATH_MAX as well
        manifest = records.output_manifest(job, 1)
        assert manifest["truncated"] is True  # below 256 folders nothing is listed
        assert [f["path"] for f in manifest["files"]] == ["leaf"]  # the deep one is past that
        if os.geteuid() == 0:  # the hand-over to the job's user walks only as root
            prepare_writable(job, 65534, 65534, [])
            assert (job.output / "a" / "a").stat().st_uid == 65534
            assert (job.output / ("a/" * 1_000)).stat().st_uid == 65534  # past os.walk's
    finally:  # pytest's own clean-up recurses (shutil.rmtree on 3.11)
        archives.remove_tree(deep_tmp / "job")


def test_a_bundle_member_nested_past_the_loose_depth_is_refused() -> None:
    """A bag 1,200 deep went through bagit's and Python's recursive walks: RecursionError,
    and its unpacked copy left in /tmp on every try."""
    from runner.core import archives

    assert len(archives.member_parts("d/" * archives.MAX_LOOSE_DEPTH, strict=False)) == 512
    with pytest.raises(archives.UnsafeArchive, match="parts deep, more than 512"):
        archives.member_parts("d/" * (archives.MAX_LOOSE_DEPTH + 1), strict=False)


def test_safefs_walk_follows_no_link_and_stops_where_it_is_told(tmp_path: Path) -> None:
    import os

    from runner.core import safefs

    _chain(tmp_path / "t", 5)
    os.symlink("/etc", tmp_path / "t" / "a" / "etc")
    seen = [(os.path.relpath(f, tmp_path / "t"), d, sorted(o)) for f, d, _, o in
            safefs.walk(tmp_path / "t", max_depth=2)]  # fmt: skip
    assert seen == [(".", 0, ["leaf"]), ("a", 1, ["etc"]), ("a/a", 2, [])]
    assert list(safefs.walk(tmp_path / "missing")) == []
    with pytest.raises(FileNotFoundError):
        list(safefs.walk(tmp_path / "missing", unreadable="raise"))


def _bundle_with_ledger(tmp: Path, ledger_lines: int) -> Path:
    """An unsigned bag (as a hostile exporter writes one) whose ledger is ``ledger_lines``
    lines of garbage; everything before the ledger's check holds."""
    import hashlib
    import io
    import json
    import tarfile

    from runner.contract import parse_json, verify_data
    from runner.testing import write_contract

    (tmp / "c").mkdir(parents=True)
    contract = write_contract(tmp / "c", "runner-cpu:local@sha256:" + "0" * 64,
                              with_inputs=False)  # fmt: skip
    raw = contract.read_bytes()
    digest = verify_data(parse_json(raw, "t"), raw, tmp / "c", "t").digest
    envelope = {"runnerVersion": "0", "jobId": "j", "contractDigest": digest,
                "status": "succeeded", "failure": None, "exitCode": 0, "image": None,
                "limits": None, "measurementErrors": [], "measurements": [],
                "timings": {"startedAt": "t", "finishedAt": "t", "totalSeconds": 1.0}}  # fmt: skip
    files = {
        "data/input/task.json": raw,
        "data/result.json": json.dumps(envelope).encode(),
        "data/record/ledger.jsonl": b"x\n" * ledger_lines,
    }
    manifest = "".join(f"{hashlib.sha256(v).hexdigest()}  {k}\n" for k, v in files.items())
    size = sum(len(v) for v in files.values())
    tags = {
        "bagit.txt": b"BagIt-Version: 0.97\nTag-File-Character-Encoding: UTF-8\n",
        "bag-info.txt": f"Payload-Oxum: {size}.{len(files)}\n".encode(),
        "manifest-sha256.txt": manifest.encode(),
        "runner-bundle.json": b'{"kind": "runner.bundle-info"}',
    }
    tags["tagmanifest-sha256.txt"] = "".join(
        f"{hashlib.sha256(v).hexdigest()} {k}\n" for k, v in tags.items()
    ).encode()
    archive = tmp / "b.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in ("bag", "bag/data", "bag/data/input", "bag/data/record"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, data in {**tags, **files}.items():
            info = tarfile.TarInfo(f"bag/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return archive


def test_a_bundles_ledger_of_a_million_lines_is_one_problem(tmp_path: Path) -> None:
    """The ledger was read whole and each bad line kept as a problem: a 4 KB archive of a
    million-line ledger took 14 s and 790 MB, and printed a million problems."""
    from runner.results.bundle.verify import MAX_LEDGER_LINES, Keys, verify

    archive = _bundle_with_ledger(tmp_path, MAX_LEDGER_LINES + 1)
    t = time.process_time()
    report = verify(archive, keys=Keys([], []), allow_untrusted=True)
    assert time.process_time() - t < 10.0
    ledger = [p for p in report.problems if p.file == "data/record/ledger.jsonl"]
    assert len(ledger) == 1, report.problems[:5]
    assert "past what is checked" in ledger[0].message


def test_a_bundles_ledger_lists_its_first_hundred_problems(tmp_path: Path) -> None:
    from runner.results.bundle.verify import Keys, verify

    report = verify(_bundle_with_ledger(tmp_path, 1_000), keys=Keys([], []),
                    allow_untrusted=True)  # fmt: skip
    ledger = [p.message for p in report.problems if p.file == "data/record/ledger.jsonl"]
    assert len(ledger) == 101, ledger[:3]
    assert ledger[-1] == "... and 900 more problems, not listed"


def test_a_working_copy_a_thousand_deep_is_removed_for_the_next_attempt(deep_tmp: Path) -> None:
    """The next attempt removes the working copy the last one left (the job's to shape):
    shutil.rmtree recursed, and a tree 1,200 deep failed every retry's staging."""
    from runner.execution import layout

    _chain(deep_tmp / "repository", 1_200)
    layout._remove(deep_tmp / "repository")
    assert not (deep_tmp / "repository").exists()


def test_an_export_leaves_out_what_a_verifier_would_refuse_as_too_deep(deep_tmp: Path) -> None:
    from runner.results.bundle import export

    _chain(deep_tmp / "job" / "output", 600)
    files, skipped = export._walk(deep_tmp / "job", "output")
    assert files == ["output/leaf"]
    assert [s.why for s in skipped] == [export._TOO_DEEP]
    assert skipped[0].path.count("/") == export._DEEPEST


@pytest.mark.skipif(os.geteuid() != 0, reason="makes the tree as root, measures it as nobody")
def test_a_folder_the_runner_may_not_read_stops_the_job_as_over_its_quota() -> None:
    """A runner not run as root runs the job as its own uid, which may `chmod 000` a folder of
    its own: the meter skipped what it could not list, and 20 MB in it went uncounted."""
    import shutil
    import subprocess
    import sys
    import tempfile

    top = Path(tempfile.mkdtemp(dir="/tmp", prefix="round15-"))  # outside pytest's 0700 folders
    try:
        top.chmod(0o755)
        (top / "out" / "hide").mkdir(parents=True)
        (top / "out" / "hide" / "big").write_bytes(b"x" * 1_000_000)
        for path in (top / "out", top / "out" / "hide", top / "out" / "hide" / "big"):
            os.chown(path, 65534, 65534)
        (top / "out" / "hide").chmod(0)
        script = (  # the runner's modules imported as root, then measured as nobody
            "import os, sys\nfrom pathlib import Path\nfrom runner.execution import quotas\n"
            "os.setgroups([])\nos.setgid(65534)\nos.setuid(65534)\n"
            "m = quotas.DiskMeter([Path(sys.argv[1])], quota=10_000)\n"
            "print(m.measure() > m.quota, m.unmeasured)\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", script, str(top / "out")], capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120, check=False, cwd="/",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split(" ", 1) == [
            "True", "a folder cannot be read by the runner: Permission denied\n"
        ]  # fmt: skip
        # A folder of another uid (a rootless engine's mapped one) is no job's doing against
        # the meter: skipped, as before.
        os.chown(top / "out" / "hide", 12345, 12345)
        proc = subprocess.run(
            [sys.executable, "-c", script, str(top / "out")], capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120, check=False, cwd="/",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "False None\n"
    finally:
        (top / "out" / "hide").chmod(0o755)
        shutil.rmtree(top)


def test_safefs_walk_keeps_names_not_a_path_for_each_folder_it_has_still_to_enter(
    tmp_path: Path,
) -> None:
    """Its stack held a whole path for every folder still to enter: a job's tree of many
    folders under a long path cost the walker about as much memory as the tree's disk."""
    import tracemalloc

    from runner.core import safefs

    deep = tmp_path / "/".join(["n" * 250] * 9)  # a path of about 2,300 bytes
    deep.mkdir(parents=True)
    for i in range(5_000):
        (deep / f"s{i}").mkdir()
    tracemalloc.start()
    try:
        count = sum(1 for _ in safefs.walk(tmp_path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 1 + 9 + 5_000
    assert peak < 4_000_000  # 5,000 paths of 2,300 bytes held at once were over 11 MB


def test_an_export_leaves_out_an_output_file_the_job_named_too_deep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files a job names (its result.json lists any) were bundled at any depth: past 510
    parts the bundle never verified, past about 1,000 the export's own mkdir recursed."""
    from runner.results.bundle import export
    from runner.staging.jobdir import prepare

    deep = "/".join(["d"] * 600) + "/f.txt"
    monkeypatch.setattr(export, "output_files", lambda env: [(deep, "sha256:" + "0" * 64, None)])
    items, skipped = export._plan(prepare(tmp_path / "job"), None, with_inputs=False)  # type: ignore[arg-type]
    assert f"output/{deep}" not in {i.rel for i in items}
    assert [(s.path, s.why) for s in skipped] == [(f"output/{deep}", export._TOO_DEEP)]


def test_an_input_of_a_thousand_folders_is_staged_with_few_descriptors(tmp_path: Path) -> None:
    """Staging opened every subfolder as it found it: a dataset of 1,000 class folders ran a
    runner under a limit of 1,024 descriptors out of them, and the input was refused."""
    for i in range(400):
        (tmp_path / "data" / f"class{i:03}").mkdir(parents=True)
        (tmp_path / "data" / f"class{i:03}" / "x.txt").write_text(str(i))
    code = (
        "from runner.staging import jobdir\n"
        "got = jobdir._stage_tree(Path(sys.argv[1]), 'data', Path(sys.argv[2]), "
        "jobdir._Tally(jobdir.InputRules(), ''))\n"
        "print(len(got.files))\n"
    )
    assert _with_few_descriptors(128, code, str(tmp_path), str(tmp_path / "staged")) == "400\n"
    assert (tmp_path / "staged" / "data" / "class399" / "x.txt").read_text() == "399"


def test_an_export_walks_a_thousand_folders_with_few_descriptors(tmp_path: Path) -> None:
    """Export's walk opened every subfolder as it found it: under a limit of 1,024 an input
    of 1,100 folders was listed as skipped ("Too many open files") instead of bundled."""
    for i in range(400):
        (tmp_path / "job" / "input" / f"c{i:03}").mkdir(parents=True)
        (tmp_path / "job" / "input" / f"c{i:03}" / "x.txt").write_text(str(i))
    code = (
        "from runner.results.bundle import export\n"
        "files, skipped = export._walk(Path(sys.argv[1]), 'input')\n"
        "print(len(files), skipped, files[0], files[-1])\n"
    )
    got = _with_few_descriptors(128, code, str(tmp_path / "job"))
    assert got == "400 [] input/c000/x.txt input/c399/x.txt\n"
