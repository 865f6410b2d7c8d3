"""Hostile jobs against the input cache (issue 16 item 4), under runc and under gVisor's runsc:
a job staged by hard links from the cache cannot change a cached byte, whatever it tries.

With HOSTILE_REPORT_FILE=<file> set, each case appends one JSON line for
scripts/hostile_report.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runner.app import issuer
from runner.caches import inputcache
from runner.caches.inputcache import InputCache
from tests.support import json_measurement, write_contract
from tests.support.hostile import RUNTIMES, measured_run, py, record

pytestmark = [pytest.mark.docker, pytest.mark.hostile]

HOSTILE = r"""
import errno, json, os
tried = {}
repo = "/job/workspace/repository"
for folder, _dirs, names in os.walk(repo):
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.islink(path):
            with open(path, "wb") as f:
                f.write(b"the job was here\n")
tried["workspace"] = "written"
src = "/job/input/paper.md"
for what, act in (
    ("link", lambda: os.link(src, "/job/workspace/linked-paper.md")),
    ("chmod", lambda: os.chmod(src, 0o666)),
    ("append", lambda: open(src, "ab").write(b"x")),
    ("rename", lambda: os.rename(src, "/job/input/moved.md")),
):
    try:
        act()
        tried[what] = "done"
    except OSError as exc:
        tried[what] = errno.errorcode[exc.errno]
json.dump({"accuracy": 1.0, "tried": tried}, open("/job/output/out.json", "w"))
"""


def _snapshot(cache: InputCache) -> dict[str, bytes]:
    out = {}
    for hexd in cache.hexes():
        data = cache.data(hexd)
        if data.is_file():
            out[hexd] = data.read_bytes()
            continue
        for folder, _dirs, names in os.walk(data):
            for name in names:
                path = Path(folder) / name
                if not path.is_symlink():
                    out[f"{hexd}/{path.relative_to(data)}"] = path.read_bytes()
    return out


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_job_cannot_change_a_cached_input(tmp_path: Path, image_id: str, runtime: str) -> None:
    """Two real jobs on one state folder: the first caches its inputs; the second is staged by
    hard links, overwrites every file of its working copy, and tries to hard-link an input into
    its workspace (EXDEV: another mount), to chmod, append to and rename an input (read-only
    mount). Every cached byte stays, `runner cache verify` agrees, and the check of input/ after
    the job finds it unchanged."""
    contract = write_contract(
        tmp_path, image_id, command=py(HOSTILE), measurements=[json_measurement("out.json")]
    )
    issuer.pin(contract)  # binds the inputs' digests: the second job is staged from the cache
    state = tmp_path / "state"
    code, env, err, _ = measured_run(contract, state, runtime)
    assert code == 0, (env.get("failure"), err)
    cache = InputCache.of_state(state)
    assert len(cache.hexes()) == 2
    before = _snapshot(cache)
    code, env, err, peak = measured_run(contract, state, runtime)
    assert code == 0, (env.get("failure"), err)
    job = Path(env["jobDir"])
    tried = json.loads((job / "output" / "out.json").read_text())["tried"]
    assert tried["workspace"] == "written"
    assert tried["link"] == "EXDEV", tried
    assert tried["chmod"] in {"EROFS", "EPERM"}, tried
    assert tried["append"] in {"EROFS", "EACCES"}, tried
    assert tried["rename"] in {"EROFS", "EACCES", "EPERM"}, tried
    paper = cache.data(next(h for h in cache.hexes() if cache.data(h).is_file()))
    assert os.lstat(job / "input" / "paper.md").st_ino == os.lstat(paper).st_ino
    assert _snapshot(cache) == before
    assert inputcache.verify(cache, remove=False) == {}
    assert env["inputsUnchanged"] is True, env.get("warnings")
    record("input cache", runtime, env, held=True, tried=tried, runnerPeakRss=peak)
