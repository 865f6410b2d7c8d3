"""The garbage collector held off while a `runner` process starts (runner.core.collector):
paused by the command line's entry, let run again once a command's imports are done, before
anything long (a job, a server's or a batch's forks)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.core import collector

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def collector_as_found() -> Iterator[None]:
    """Nothing frozen at the start (whatever froze objects before), and the test process's
    collector left as it was found."""
    was = gc.isenabled()
    gc.unfreeze()
    yield
    gc.unfreeze()
    collector._paused = False
    if was:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.usefixtures("collector_as_found")
def test_resume_lets_a_paused_collector_run_again_with_what_was_made_frozen() -> None:
    gc.enable()
    collector.pause()
    assert not gc.isenabled()
    made = [[i] for i in range(1000)]  # tracked objects made while it was held off
    collector.resume()
    assert gc.isenabled()
    assert all(gc.is_tracked(m) for m in made)
    assert gc.get_freeze_count() >= len(made)  # none frozen before (the fixture)
    frozen = gc.get_freeze_count()
    collector.resume()  # once only: a second call neither freezes nor turns anything on
    assert gc.get_freeze_count() == frozen


@pytest.mark.usefixtures("collector_as_found")
def test_a_collector_someone_else_turned_off_stays_off() -> None:
    gc.disable()
    collector.pause()
    collector.resume()
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0


PROBE = """
import gc, json, os, sys
seen = {}
out, jobs = sys.argv[1], sys.argv[1] + ".jobs"

def probe(name, real):
    def wrapped(*args, **kwargs):
        seen[name] = gc.isenabled()
        return real(*args, **kwargs)
    return wrapped

import runner.cli.run as cli_run
import runner.cli.parsers as cli_parsers
import runner.cli.verify as cli_verify
import runner.planning.plan as plan
from runner.execution import orchestrator
from runner.core.errors import HostConfigError

def job(path, options, progress=None):
    with open(jobs, "a") as f:  # a batch's jobs run in forks: each says so in the file
        f.write(json.dumps([os.getpid(), gc.isenabled()]) + "\\n")
    raise HostConfigError("the probe's end")  # ends the command: no engine is asked

cli_run.cmd_run = probe("cmd_run", cli_run.cmd_run)
cli_parsers.cmd_parsers = probe("cmd_parsers", cli_parsers.cmd_parsers)
plan.build = probe("verify's plan", plan.build)
orchestrator.run = job
from runner.client import main
sys.argv = ["runner", *sys.argv[2:]]
try:
    main()  # as the runner program calls it
except SystemExit:
    pass
seen["at the end"] = gc.isenabled()
if os.path.exists(jobs):
    seen["jobs"] = [on for pid, on in map(json.loads, open(jobs))]
open(out, "w").write(json.dumps(seen))
"""


def _probe(tmp_path: Path, *argv: str) -> dict[str, bool]:
    out = tmp_path / "seen.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RUNNER_SERVER": "off",
           "RUNNER_CONFIG_DIR": str(tmp_path / "config")}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *argv],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert out.exists(), proc.stderr
    seen: dict[str, bool] = json.loads(out.read_text())
    return seen


def _toy(tmp_path: Path) -> Path:
    from runner.contract import with_digest
    from runner.testing import TOY

    data = json.loads((TOY / "task.json").read_text())
    data["environment"]["image"] = "sha256:" + "ab" * 32  # pinned: nothing asks the engine
    path = tmp_path / "task.json"
    path.write_text(json.dumps(with_digest(data)))
    return path


def test_a_run_imports_with_the_collector_held_off_and_runs_its_job_with_it(
    tmp_path: Path,
) -> None:
    seen = _probe(
        tmp_path, "run", str(_toy(tmp_path)), "--allow-unsigned", "--state-dir",
        str(tmp_path / "state"),
    )  # fmt: skip
    assert seen == {"cmd_run": False, "jobs": [True], "at the end": True}


def test_a_batch_forks_its_jobs_with_the_collector_running(tmp_path: Path) -> None:
    toy = _toy(tmp_path)
    other = tmp_path / "other.json"
    data = json.loads(toy.read_text())
    data.pop("contractDigest")
    data["name"] += "-other"
    from runner.contract import with_digest

    other.write_text(json.dumps(with_digest(data)))
    seen = _probe(
        tmp_path, "run", str(toy), str(other), "--allow-unsigned", "--parallel", "2",
        "--state-dir", str(tmp_path / "state"),
    )  # fmt: skip
    assert seen == {"cmd_run": False, "jobs": [True, True], "at the end": True}


def test_verify_is_held_off_to_its_end_and_other_commands_are_not(tmp_path: Path) -> None:
    toy = str(_toy(tmp_path))
    for spelled in (["verify", "contract"], ["verify"]):  # the flat spelling is the same
        seen = _probe(tmp_path, *spelled, toy, "--allow-unsigned")
        assert seen == {"verify's plan": False, "at the end": True}
    assert _probe(tmp_path, "parsers", "--json") == {"cmd_parsers": True, "at the end": True}


def test_a_warm_process_forks_with_the_collector_running(tmp_path: Path) -> None:
    """warm_up (a server's, a batch's) lets it run before the forks, whose jobs may be long."""
    script = (
        "import gc\nfrom runner.core import collector\ncollector.pause()\n"
        "from runner.app.warmup import warm_up\nwarm_up()\nassert gc.isenabled()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
