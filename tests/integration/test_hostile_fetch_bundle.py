"""Hostile sources and bundles, and the distribution's own Python (issue 25, items 6, 7, 14):
a source that trickles its response head, a bundle whose member is a bomb (against its own
Payload-Oxum, the free space, or as a pax header), and the README's commands run by a venv
made with /usr/bin/python3 (Debian 12's 3.11.2, older than the ``filter=`` argument of
tarfile's extract). Loopback servers and test folders only.

The tests that need no engine are in tests/unit/test_hostile_fetch_bundle.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT, SESSION_ID, SESSION_LABEL, building_the_tree, write_contract
from tests.unit.test_hostile_fetch_bundle import check_bomb_refused

pytestmark = pytest.mark.hostile


@pytest.mark.slow
def test_a_1_gib_bomb_before_bag_info_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """The unit case's bag-info-last bomb at 1 GiB of zeros (a 1 MiB .tar.gz), read through."""
    check_bomb_refused(tmp_path, 1024, bag_info_first=False)


# -- item 14: the README's commands on the distribution's own Python -----------------------

SYSTEM_PYTHON = Path("/usr/bin/python3")
WHEELHOUSE = ROOT / ".wheelhouse"


@pytest.mark.docker
def test_the_readme_commands_run_on_the_distributions_own_python(
    tmp_path: Path, image_id: str
) -> None:
    """scripts/demo.sh's path -- keygen, trust, pin, sign, run the toy, export, verify-bundle --
    with a `runner` installed (not editable) into a venv made by the distribution's own
    /usr/bin/python3 (Debian 12's is 3.11.2: `TarFile.extract(filter=)` came in 3.11.4 and
    verify-bundle died on it). Dependencies from the wheelhouse scripts/setup.sh fills."""
    assert SYSTEM_PYTHON.is_file(), "no /usr/bin/python3: scripts/setup.sh installs python3"
    assert (WHEELHOUSE / ".stamp").is_file(), "run scripts/setup.sh: it fills .wheelhouse/"
    env = {
        k: v for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("RUNNER_")
    }  # fmt: skip
    env.update(
        HOME=str(tmp_path), PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1",
        RUNNER_CONFIG_DIR=str(tmp_path / "config"),
    )  # fmt: skip

    def run(*argv: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(a) for a in argv], capture_output=True, text=True, cwd=tmp_path, env=env,
            timeout=timeout, check=False,
        )  # fmt: skip
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    version = run(SYSTEM_PYTHON, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])")
    venv = tmp_path / "venv"
    made = run(SYSTEM_PYTHON, "-m", "venv", venv)
    assert made.returncode == 0, f"{made.stderr} (Debian: apt-get install python3-venv)"
    with building_the_tree():
        installed = run(
            venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", "--find-links",
            WHEELHOUSE, ROOT,
        )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    where = run(venv / "bin" / "python", "-c", "import runner, sys; print(runner.__file__)")
    assert where.stdout.startswith(str(venv)), where.stdout  # the installed copy, not the tree
    runner = venv / "bin" / "runner"

    folder = tmp_path / "toy"
    folder.mkdir()
    contract = write_contract(folder, image_id)
    issuer = tmp_path / "config" / "issuer" / "local-issuer"
    assert run(runner, "keygen", "--out", issuer).returncode == 0
    assert run(runner, "trust", f"{issuer}.pub").returncode == 0
    pinned, signed = folder / "task.pinned.json", folder / "task.pinned.dsse.json"
    pin = run(runner, "pin", contract, "--image", "runner-cpu:local", "-o", pinned)
    assert pin.returncode == 0, pin.stderr
    job = f"toy-debian-{SESSION_ID[:8]}"
    sign = run(runner, "sign", pinned, "--key", f"{issuer}.key", "--expires-in", "1h",
               "--job-id", job, "-o", signed)  # fmt: skip
    assert sign.returncode == 0, sign.stderr
    state = tmp_path / "state"
    ran = run(runner, "run", signed, "--state-dir", state, "--json",
              "--label", f"{SESSION_LABEL}={SESSION_ID}")  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    envelope = json.loads(ran.stdout)
    assert envelope["status"] == "succeeded" and envelope["measurements"][0]["value"] == 0.819
    bundle = tmp_path / f"{job}.bag.tar.gz"
    exported = run(runner, "export", job, "--state-dir", state, "-o", bundle)
    assert exported.returncode == 0, exported.stderr
    verified = run(runner, "verify-bundle", bundle, "--json")
    assert verified.returncode == 0, (
        f"verify-bundle on Python {version.stdout.strip()}:\n{verified.stdout}{verified.stderr}"
    )
    report = json.loads(verified.stdout)
    assert report["valid"] is True and report["measurements"], report
