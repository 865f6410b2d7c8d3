"""The agent runtime in the contract's image, attacked (issue 26's review): the cached runtime
changed or swapped under the runner, an entry pruned while mounted, a copying container left
by a killed runner, a host network lost to the proxy, a fit checked on the wrong PATH or
misread, and an image that does the work in the runtime's place.

Pure tests use the fake backend (an image's files are a host folder); the others the engine.

The tests that need the engine are in tests/integration/test_hostile_agent_image.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from runner.backends.base import ContainerSpec
from runner.contract import load_contract, with_digest
from runner.core.errors import PolicyViolation
from runner.execution import agent_run, agentfit, agentimage
from runner.planning import plan
from runner.planning.policy import HostPolicy
from runner.state.ledger import LedgerState
from tests.support import SEED
from tests.support.agents import CLAUDE_ARGV, CLAUDE_RUNTIME
from tests.unit.test_agent_image import (
    GLIBC_IMAGE,
    _elf,
    _fake,
    _seed_plan,
)

pytestmark = pytest.mark.hostile

PATHS = ["/usr/local/bin/claude", "/usr/local/bin/run-claude"]
ARGV = ["/opt/runner-agent/run-claude", "/job/input/prompt.md"]


def _spec() -> ContainerSpec:
    grant = {"upstreamNetwork": "uplink", "allow": ["pypi.org:443"]}
    limits = _seed_plan(egress=grant).limits
    return ContainerSpec("c", "i", ["/bin/sh"], [], "0:0", "/", {}, {}, [], limits)


def _runtime(tmp_path: Path, files: dict[str, bytes | str] = GLIBC_IMAGE) -> Any:
    fake, runtime_id, contract_id = _fake(tmp_path, files)
    runtime = agentimage.ensure(fake, runtime_id, PATHS, tmp_path / "cache", {})
    return fake, runtime, contract_id


# --------------------------------------------------------------------------- the cache entry


def test_a_runtime_folder_swapped_for_a_link_is_not_mounted(tmp_path: Path) -> None:
    """Someone who can write the state folder puts a link where the entry's files/ were
    (into a folder of their making, with the same names): the entry is not believed; it is
    extracted again, and what is mounted is a real folder."""
    fake, runtime, _ = _runtime(tmp_path)
    entry = runtime.folder.parent
    decoy = tmp_path / "decoy"
    shutil.copytree(runtime.folder, decoy)
    os.chmod(entry, 0o700)
    os.chmod(runtime.folder, 0o700)
    shutil.rmtree(runtime.folder)
    os.symlink(decoy, runtime.folder)
    os.chmod(entry, 0o555)  # noqa: S103 - as it was
    again = agentimage.ensure(fake, runtime.image_id, PATHS, tmp_path / "cache", {})
    assert again.extracted
    assert not again.folder.is_symlink() and again.folder.is_dir()


def test_a_rewritten_manifest_is_not_believed(tmp_path: Path) -> None:
    """runtime.json rewritten to match a swapped file (same stamps written in): the seal kept
    beside the entry (outside what is mounted) no longer matches, so it is extracted again."""
    fake, runtime, _ = _runtime(tmp_path)
    entry = runtime.folder.parent
    target = runtime.folder / "run-claude"
    os.chmod(entry, 0o700)
    os.chmod(runtime.folder, 0o700)
    target.chmod(0o700)
    target.write_bytes(b"#!/bin/sh\necho owned\n")
    target.chmod(0o555)
    st = target.stat()
    manifest = entry / "runtime.json"
    data = json.loads(manifest.read_text())
    for f in data["files"]:
        if f["path"] == "run-claude":
            f.update(size=st.st_size, inode=st.st_ino, mtimeNs=st.st_mtime_ns,
                     ctimeNs=st.st_ctime_ns, dev=st.st_dev)  # fmt: skip
    manifest.chmod(0o644)
    manifest.write_text(json.dumps(data))
    manifest.chmod(0o444)
    os.chmod(runtime.folder, 0o555)  # noqa: S103 - as it was
    os.chmod(entry, 0o555)  # noqa: S103
    again = agentimage.ensure(fake, runtime.image_id, PATHS, tmp_path / "cache", {})
    assert again.extracted
    assert (again.folder / "run-claude").read_bytes().endswith(b'"$@"\n')


def test_a_runtime_changed_after_its_check_is_refused_before_the_mount(tmp_path: Path) -> None:
    """Between bring() (the check) and the container's creation the inputs are staged, which
    can take minutes: the entry is checked again as it is mounted; changed, nothing is."""
    _, runtime, _ = _runtime(tmp_path)
    record: Any = None
    brought = agentimage.Brought(runtime, record, {}, "/opt/runner-agent:/usr/bin")
    spec = _spec()
    applied = brought.apply(spec, {})
    assert applied.labels[agentimage.IN_USE_LABEL] == runtime.folder.parent.name
    assert applied.environment["LD_PRELOAD"] == "" and applied.environment["LD_AUDIT"] == ""
    target = runtime.folder / "claude"
    os.chmod(runtime.folder, 0o700)
    target.chmod(0o755)  # a chmod is enough (ctime)
    with pytest.raises(PolicyViolation, match="changed after they were checked"):
        brought.apply(spec, {})


def test_the_contract_images_preload_is_undone_unless_the_adapter_sets_it(
    tmp_path: Path,
) -> None:
    """LD_PRELOAD / LD_AUDIT of the contract's image would load its code into the runtime
    (which holds the model key): set empty in the container; the adapter's env may set them."""
    _, runtime, _ = _runtime(tmp_path)
    record: Any = None
    brought = agentimage.Brought(runtime, record, {"LD_PRELOAD": "/evil.so"}, "/usr/bin")
    spec = _spec()
    assert brought.apply(spec, {}).environment["LD_PRELOAD"] == ""
    own = dataclasses.replace(spec, environment={"LD_PRELOAD": "/usr/lib/libjemalloc.so"})
    assert brought.apply(own, {}).environment["LD_PRELOAD"] == "/usr/lib/libjemalloc.so"


def test_prune_and_verify_never_remove_a_mounted_runtime(tmp_path: Path) -> None:
    """`runner cache prune` removes runtimes unused for its --older-than, never one a
    container mounts; `runner cache verify` reports a bad mounted one and keeps it."""
    fake, runtime_id, _ = _fake(tmp_path, GLIBC_IMAGE)
    state = tmp_path / "state"
    root = agentimage.cache_root(state)
    a = agentimage.ensure(fake, runtime_id, PATHS, root, {})
    b = agentimage.ensure(fake, runtime_id, PATHS[:1], root, {})
    name_a, name_b = a.folder.parent.name, b.folder.parent.name
    mounted = {name_a: ["runner-job-1"]}
    agentimage.release(a)  # their attempts are over (a's container still exists)
    agentimage.release(b)

    def in_use(name: str) -> list[str]:
        return mounted.get(name, [])

    recent = agentimage.prune(state, older_than=3600, in_use=in_use)
    assert recent.removed == [] and recent.kept_in_use == {}  # both used just now
    done = agentimage.prune(state, older_than=None, in_use=in_use)
    assert done.removed == [name_b] and done.kept_in_use == {name_a: ["runner-job-1"]}
    assert done.freed_bytes > 0 and a.folder.is_dir() and not b.folder.parent.exists()
    os.chmod(a.folder, 0o700)
    (a.folder / "claude").chmod(0o755)
    checked, bad = agentimage.verify(state, remove=True, in_use=in_use)
    assert checked == 1 and "kept: in use by runner-job-1" in bad[name_a]
    assert a.folder.is_dir()
    checked, bad = agentimage.verify(state, remove=True, in_use=lambda _: [])
    assert name_a in bad and not a.folder.parent.exists()


# --------------------------------------------------------------------------- the fit check


def test_env_shebang_options_name_the_command_they_run(tmp_path: Path) -> None:
    for line, command in [
        (b"#!/usr/bin/env -S python3 -u\n", "python3"),
        (b"#!/usr/bin/env -i LANG=C node\n", "node"),
        (b"#!/usr/bin/env bash\n", "bash"),
    ]:
        (tmp_path / "s").write_bytes(line)
        needs = agentfit.needs_of(tmp_path, "s")
        assert needs is not None and needs.interpreter_arg == command, line


def test_an_image_naming_no_architecture_is_checked_against_the_hosts(tmp_path: Path) -> None:
    """An image whose configuration names no architecture runs on the host's: a runtime
    built for another one is refused (the check was skipped before)."""
    fake, runtime_id, contract_id = _fake(
        tmp_path, {**GLIBC_IMAGE, "usr/local/bin/claude": b""}, arch=""
    )
    root = tmp_path / "runtime-image" / "usr/local/bin"
    (root / "claude").unlink()
    (root / "claude").write_bytes(_elf(183 if agentfit.host_arch() != "arm64" else 62,
                                       b"/lib64/ld-linux-x86-64.so.2"))  # fmt: skip
    (root / "claude").chmod(0o755)
    runtime = agentimage.ensure(fake, runtime_id, PATHS, tmp_path / "cache", {})
    with pytest.raises(PolicyViolation, match=f"the image for {agentfit.host_arch()}"):
        agentfit.check_fits(fake, fake.images[contract_id], "paper:1", runtime, ARGV, [], {})


def test_a_glibc_loader_without_glibc_is_refused(tmp_path: Path) -> None:
    """A musl image with a shim at glibc's loader path (gcompat's way) has no libc.so.6:
    Claude Code's glibc binary would fail at its first call into libc."""
    musl = {k: v for k, v in GLIBC_IMAGE.items() if not k.endswith("libc.so.6")}
    fake, runtime, contract_id = _runtime(tmp_path, musl)
    with pytest.raises(PolicyViolation, match=r"no glibc \(libc\.so\.6\) for claude"):
        agentfit.check_fits(fake, fake.images[contract_id], "paper:1", runtime, ARGV, [], {})


def test_the_fit_is_checked_on_the_path_the_runtime_starts_with(tmp_path: Path) -> None:
    """The adapter's PATH, when it names one, is what the runtime's commands are found on:
    a command only on the image's PATH is missing there, one only on the adapter's found."""
    files = {**GLIBC_IMAGE, "custom/bin/tool": b"tool"}
    fake, runtime, contract_id = _runtime(tmp_path, files)
    info = fake.images[contract_id]
    agentfit.check_fits(fake, info, "paper:1", runtime, ARGV, ["tool"], {},
                          "/opt/runner-agent:/custom/bin")  # fmt: skip
    with pytest.raises(PolicyViolation, match=r"no tool \(on its PATH /usr/local/bin:/usr/bin\)"):
        agentfit.check_fits(fake, info, "paper:1", runtime, ARGV, ["tool"], {})
    with pytest.raises(PolicyViolation, match=r"no bash \(on its PATH /custom/bin\)"):
        agentfit.check_fits(fake, info, "paper:1", runtime, ARGV, ["bash"], {},
                              "/opt/runner-agent:/custom/bin")  # fmt: skip


def test_the_papers_path_reaches_the_container_as_the_image_gives_it(tmp_path: Path) -> None:
    """Relative entries and a long PATH are the paper's: the container's PATH is the
    runtime's folder, then the image's PATH verbatim (only the fit check caps its search;
    before, relative entries were dropped and the PATH cut at 32 entries)."""
    long_path = ":".join(["bin", *(f"/opt/p{i}" for i in range(40)), "/usr/bin"])
    fake, _, contract_id = _fake(tmp_path, GLIBC_IMAGE)
    info = dataclasses.replace(fake.images[contract_id], env=(f"PATH={long_path}",))
    fake.images[contract_id] = info
    adapter = {"image": "sha256:" + "1" * 64, "argv": CLAUDE_ARGV, **CLAUDE_RUNTIME}
    pol = HostPolicy.model_validate({"agents": {"claude-code": adapter}})
    data = json.loads(SEED.read_text())
    data["environment"].update(image=contract_id, networkAccess=False)
    data.pop("contractDigest")
    path = tmp_path / "task.json"
    path.write_text(json.dumps(with_digest(data)))
    p = plan.build(load_contract(path), pol, job_id="j", host_uid=0, host_gid=0)

    def acquire(pin: Any) -> Any:
        return type("A", (), {"info": fake.images[pin.lookup]})(), None

    brought = agentimage.bring(fake, p, info, acquire, tmp_path / "state", {})
    assert brought is not None and brought.path == f"/opt/runner-agent:{long_path}"
    assert agentfit.search_path(long_path)[-1] == "/usr/bin"  # 41 absolute entries
    wider = ":".join(f"/p{i}" for i in range(agentfit.MAX_SEARCH + 5))
    assert len(agentfit.search_path(wider)) == agentfit.MAX_SEARCH


# --------------------------------------------------------------------------- the network


def test_an_adapters_own_network_is_kept_under_network_access(tmp_path: Path) -> None:
    """networkAccess true on a host whose adapter reaches its model through the operator's
    network (no allow) and whose policy grants egress pairs: the agent stays on the
    adapter's network (before, the proxy's won and the model was out of reach); a contract
    asking for egress besides is refused, naming why."""
    grant = {"upstreamNetwork": "uplink", "allow": ["pypi.org:443"]}
    p = _seed_plan(egress=grant, agents=_adapter(network="model-gw"))
    assert p.limits.network == "model-gw" and p.egress is None
    data = json.loads(SEED.read_text())
    data["environment"].update(networkAccess=False, egress=["pypi.org:443"])
    data.pop("contractDigest")
    path = tmp_path / "task.json"
    path.write_text(json.dumps(with_digest(data)))
    pol = HostPolicy.model_validate(
        {"allowUnpinnedImages": True, "egress": grant, "agents": _adapter(network="model-gw")}
    )
    with pytest.raises(PolicyViolation, match=r"\$\.environment\.egress: .*network model-gw"):
        plan.build(load_contract(path), pol, job_id="j", host_uid=0, host_gid=0)


def test_the_envelope_names_every_pair_the_agent_could_reach() -> None:
    """agent.allow is the allowlist the agent ran behind: its adapter's and the policy's
    pairs its networkAccess was granted (before: only the adapter's)."""
    grant = {"upstreamNetwork": "uplink", "allow": ["pypi.org:443"]}
    p = _seed_plan(egress=grant, agents=_adapter(allow=["api.anthropic.com:443"]))
    record = agent_run.agent_record(p, LedgerState(), None)
    assert record is not None
    assert record.allow == ["api.anthropic.com:443", "pypi.org:443"]


def _adapter(**extra: Any) -> dict[str, Any]:
    return {
        "claude-code": {
            "image": "sha256:" + "c" * 64,
            "argv": CLAUDE_ARGV,
            **CLAUDE_RUNTIME,
            **extra,
        }
    }
