"""The agent runtime in the contract's image, attacked a fourth time: a fit remembered because a
file was merely there, names beside the cache that the runner wrote through, a cached entry
swapped whole by another user who can write the cache, an image whose paths make the engine
fail, a runtime's ELF header with offsets no file can hold, and prune racing a runner that
has just checked an entry.

Pure tests use the fake backend (an image's files are a host folder, resolved as the engine
resolves them); one the engine, for the answer the fake copies.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from runner.contract import load_contract, with_digest
from runner.core.errors import PolicyViolation
from runner.execution import agentfit, agentimage
from runner.planning import plan
from runner.planning.policy import HostPolicy
from tests.support import SEED
from tests.support.agents import CLAUDE_ARGV, CLAUDE_RUNTIME
from tests.unit.test_agent_image import GLIBC_IMAGE, _fake
from tests.unit.test_hostile_agent_image import ARGV, PATHS, _runtime

pytestmark = pytest.mark.hostile

OTHER_UID = 12345
"""A user other than the runner's: the co-tenant who can write into the state folder."""
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="making another user's files needs root")


def _plan(tmp_path: Path, contract_id: str) -> plan.ExecutionPlan:
    adapter = {"image": "sha256:" + "1" * 64, "argv": CLAUDE_ARGV, **CLAUDE_RUNTIME}
    pol = HostPolicy.model_validate({"agents": {"claude-code": adapter}})
    data = json.loads(SEED.read_text())
    data["environment"].update(image=contract_id, networkAccess=False)
    data.pop("contractDigest")
    path = tmp_path / "task.json"
    path.write_text(json.dumps(with_digest(data)))
    return plan.build(load_contract(path), pol, job_id="j", host_uid=0, host_gid=0)


def _bring(fake: Any, p: plan.ExecutionPlan, contract_id: str, state: Path) -> Any:
    def acquire(pin: Any) -> Any:
        return type("A", (), {"info": fake.images[pin.lookup]})(), None

    return agentimage.bring(fake, p, fake.images[contract_id], acquire, state, {})


# --------------------------------------------------------------------------- the fit cache


def test_a_fit_file_merely_there_is_not_believed(tmp_path: Path) -> None:
    """A fit is remembered by a file named after the pair. Before, any file at that name
    (an empty one, a link, another user's) made the runner skip the check: whoever could
    create a file there (or have the runner create one, through a link at a `.used` or
    `.lock` name) got a runtime into an image that does not fit, its /opt link check
    skipped too. Now the file must be the runner's, hold the pair's key, and be no link."""
    fake, _, contract_id = _fake(tmp_path, GLIBC_IMAGE)
    p = _plan(tmp_path, contract_id)
    state = tmp_path / "state"
    assert _bring(fake, p, contract_id, state) is not None  # it fits: remembered
    (fit,) = agentimage.fits_root(state).iterdir()
    key = fit.read_bytes()
    (tmp_path / "contract-image" / "bin" / "sh").unlink()  # now it does not fit
    fit.write_bytes(b"")  # what a link at .used or .lock would have the runner make
    with pytest.raises(PolicyViolation, match=r"; no /bin/sh"):
        _bring(fake, p, contract_id, state)
    real = tmp_path / "elsewhere"
    real.write_bytes(key)
    fit.unlink()
    fit.symlink_to(real)
    with pytest.raises(PolicyViolation, match=r"; no /bin/sh"):
        _bring(fake, p, contract_id, state)
    fit.unlink()
    fit.write_bytes(key)
    calls = len(fake.calls)
    assert _bring(fake, p, contract_id, state) is not None  # the runner's own: believed
    assert not any(c[0] == "image_files" for c in fake.calls[calls:])


@as_root
def test_another_users_fit_file_is_not_believed(tmp_path: Path) -> None:
    fake, _, contract_id = _fake(tmp_path, GLIBC_IMAGE)
    p = _plan(tmp_path, contract_id)
    state = tmp_path / "state"
    _bring(fake, p, contract_id, state)
    (fit,) = agentimage.fits_root(state).iterdir()
    (tmp_path / "contract-image" / "bin" / "sh").unlink()
    os.chown(fit, OTHER_UID, OTHER_UID)  # the right key, written by someone else
    with pytest.raises(PolicyViolation, match=r"; no /bin/sh"):
        _bring(fake, p, contract_id, state)


def test_a_link_at_the_fit_files_temporary_name_is_not_written_through(tmp_path: Path) -> None:
    """The fit file was written to `.<name>.<pid>.tmp` with write_text, following a link
    planted there (the name is the pair's digest, the pid guessable): the runner overwrote
    any file it can write. Now the temporary file is made anew, no link followed."""
    fake, _, contract_id = _fake(tmp_path, GLIBC_IMAGE)
    p = _plan(tmp_path, contract_id)
    state = tmp_path / "state"
    _bring(fake, p, contract_id, state)
    (fit,) = agentimage.fits_root(state).iterdir()
    fit.unlink()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (fit.parent / f".{fit.name}.{os.getpid()}.tmp").symlink_to(victim)
    _bring(fake, p, contract_id, state)
    assert victim.read_text() == "precious\n"
    assert fit.is_file() and not fit.is_symlink()


# --------------------------------------------------------------------------- the cache entry


def test_a_link_at_the_used_mark_is_not_followed(tmp_path: Path) -> None:
    """`.<entry>.used` was touched with Path.touch and os.utime, both following a link: a
    link there made the runner create an empty file wherever it can write (a fit file, say:
    see above) or stamp one. Now the link is replaced by the runner's own mark."""
    fake, runtime_id, _ = _fake(tmp_path, GLIBC_IMAGE)
    root = tmp_path / "cache"
    first = agentimage.ensure(fake, runtime_id, PATHS, root, {})
    name = first.folder.parent.name
    made = tmp_path / "made-by-the-runner"
    used = root / f".{name}.used"
    used.unlink()
    used.symlink_to(made)
    agentimage.ensure(fake, runtime_id, PATHS, root, {})
    assert not os.path.lexists(made)
    assert used.is_file() and not used.is_symlink()


@as_root
def test_an_entry_swapped_whole_by_another_user_is_not_mounted(tmp_path: Path) -> None:
    """Another user who can write the cache folder (a group-writable state folder) renames
    the runner's entry away and puts one of their own in its place: their file, a manifest
    with its stamps, and a seal to match (all of it computable). Before, it was believed and
    mounted; now an entry, its manifest, seal and files must be the runner's user's."""
    fake, runtime, _ = _runtime(tmp_path)
    entry = runtime.folder.parent
    root = entry.parent
    os.rename(entry, root / "moved-away")
    shutil.copytree(root / "moved-away", entry)
    for path in [entry, *entry.rglob("*")]:
        os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)
    target = entry / "files" / "run-claude"
    target.chmod(0o755)
    target.write_bytes(b"#!/bin/sh\necho owned\n")
    target.chmod(0o555)
    manifest = entry / "runtime.json"
    data = json.loads(manifest.read_text())
    for f in data["files"]:
        st = (entry / "files" / f["path"]).stat()
        f.update(size=st.st_size, inode=st.st_ino, mtimeNs=st.st_mtime_ns,
                 ctimeNs=st.st_ctime_ns, dev=st.st_dev)  # fmt: skip
    manifest.chmod(0o644)
    manifest.write_text(json.dumps(data))
    manifest.chmod(0o444)
    seal = root / f".{entry.name}.seal"
    seal.unlink()
    seal.write_text(json.dumps(agentimage._seal(entry)) + "\n")
    os.chown(seal, OTHER_UID, OTHER_UID)
    again = agentimage.ensure(fake, runtime.image_id, PATHS, root, {})
    assert again.extracted
    assert (again.folder / "run-claude").read_bytes().endswith(b'"$@"\n')
    assert os.stat(again.folder / "run-claude").st_uid == os.geteuid()


# --------------------------------------------------------------------------- the fit check


def test_a_path_the_engine_cannot_resolve_is_not_the_hosts_failure(tmp_path: Path) -> None:
    """The engine answers 500 (not 404) for a path through a file or through links that
    loop, and the image's author chooses its PATH and its links: before, that ended the
    attempt `infrastructure` (the host blamed, the job retried). Now such a path holds no
    command: the command is looked for further on, or the image is refused for lacking it."""
    files = {**GLIBC_IMAGE, "etc/passwd": b"root:x:0:0::/root:/bin/sh\n",
             "loop1": "/loop2", "loop2": "/loop1"}  # fmt: skip
    fake, runtime, contract_id = _runtime(tmp_path, files)
    info = fake.images[contract_id]
    agentfit.check_fits(fake, info, "paper:1", runtime, ARGV, ["bash"], {},
                          "/opt/runner-agent:/etc/passwd:/loop1:/usr/bin")  # fmt: skip
    with pytest.raises(PolicyViolation, match=r"the image has no tool \(on its PATH"):
        agentfit.check_fits(fake, info, "paper:1", runtime, ARGV, ["tool"], {},
                              "/etc/passwd:/loop1")  # fmt: skip
    looped = {**files, "bin/sh": "/loop1"}
    fake, runtime, contract_id = _runtime(tmp_path / "b", looped)
    with pytest.raises(PolicyViolation, match=r"; no /bin/sh"):
        agentfit.check_fits(fake, fake.images[contract_id], "paper:1", runtime, ARGV, [], {})
    at_opt = {**files, "opt": "/loop1"}
    fake, runtime, contract_id = _runtime(tmp_path / "c", at_opt)
    with pytest.raises(PolicyViolation, match=r"no folder at /opt"):
        agentfit.check_fits(fake, fake.images[contract_id], "paper:1", runtime, ARGV, [], {})


def test_elf_offsets_no_file_can_hold_are_read_as_naming_no_loader(tmp_path: Path) -> None:
    """A program header table or PT_INTERP at an offset past 2**63 made seek() raise
    (ValueError, OSError) out of the fit check: a traceback, not an answer."""
    for phoff, interp_off in [(2**64 - 1, 0), (2**63 - 8, 0), (64, 2**64 - 1)]:
        header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
        header += struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, 0, phoff, 0, 0, 64, 56, 1, 0, 0, 0)
        ph = struct.pack("<IIQQQQQQ", 3, 4, interp_off, 0, 0, 28, 28, 1)
        (tmp_path / "prog").write_bytes(header + ph)
        assert agentfit.needs_of(tmp_path, "prog") == agentfit.Needs("prog", "amd64")


# --------------------------------------------------------------------------- prune


def test_prune_reads_the_used_mark_again_under_the_entrys_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prune read an entry's `.used` before taking its lock: a runner that used the entry in
    between (ensure marks it under that lock) lost it to `--older-than`."""
    fake, runtime_id, _ = _fake(tmp_path, GLIBC_IMAGE)
    state = tmp_path / "state"
    root = agentimage.cache_root(state)
    runtime = agentimage.ensure(fake, runtime_id, PATHS, root, {})
    name = runtime.folder.parent.name
    old = 30 * 86400
    os.utime(root / f".{name}.used", (os.path.getmtime(root / name) - old,) * 2)
    real = agentimage.locks.flocked

    def a_runner_came_first(path: Path, **kw: Any) -> Any:
        agentimage._touch(root, name)  # a runner's ensure, just before prune's lock
        return real(path, **kw)

    monkeypatch.setattr(agentimage.locks, "flocked", a_runner_came_first)
    done = agentimage.prune(state, older_than=14 * 86400, in_use=lambda _: [])
    assert done.removed == [] and runtime.folder.is_dir()


def test_prune_all_keeps_an_entry_a_runner_is_about_to_mount(tmp_path: Path) -> None:
    from tests.unit.test_hostile_agent_image import _spec

    fake, runtime_id, _ = _fake(tmp_path, GLIBC_IMAGE)
    state = tmp_path / "state"
    runtime = agentimage.ensure(fake, runtime_id, PATHS, agentimage.cache_root(state), {})
    done = agentimage.prune(state, older_than=None, in_use=lambda _: [])  # inputs staging
    assert done.removed == [] and list(done.kept_in_use.values()) == [
        ["a runner about to mount it"]
    ]
    record: Any = None
    agentimage.Brought(runtime, record, {}, "/usr/bin").apply(_spec(), {})
    agentimage.release(runtime)  # the attempt is over: prune may take it now
    assert agentimage.prune(state, older_than=None, in_use=lambda _: []).removed != []


# --------------------------------------------------------------------------- left open


def test_a_cache_folder_another_user_can_write_is_refused(tmp_path: Path) -> None:
    fake, runtime_id, _ = _fake(tmp_path, GLIBC_IMAGE)
    root = tmp_path / "cache"
    root.mkdir()
    root.chmod(0o777)  # the co-tenant's way in
    with pytest.raises(PolicyViolation, match="another user can write"):
        agentimage.ensure(fake, runtime_id, PATHS, root, {})
    root.chmod(0o1777)  # sticky, as /tmp: no one renames another's entry
    assert agentimage.ensure(fake, runtime_id, PATHS, root, {}).extracted
    root.chmod(0o755)
    (tmp_path).chmod(0o777)  # the folder above: a rename of cache/ itself
    try:
        with pytest.raises(PolicyViolation, match="another user can write"):
            agentimage.ensure(fake, runtime_id, PATHS, root, {})
    finally:
        tmp_path.chmod(0o700)


def test_a_link_at_the_lock_name_is_not_followed(tmp_path: Path) -> None:
    fake, runtime_id, _ = _fake(tmp_path, GLIBC_IMAGE)
    root = tmp_path / "cache"
    first = agentimage.ensure(fake, runtime_id, PATHS, root, {})
    lock = root / f".{first.folder.parent.name}.lock"
    made = tmp_path / "made-by-the-runner"
    lock.unlink()
    lock.symlink_to(made)
    agentimage.ensure(fake, runtime_id, PATHS, root, {})
    assert not os.path.lexists(made)
