"""Start-up: what a fresh ``runner`` process imports for a command (issue #29). Each command
line runs in its own interpreter, as a user's would, and the test reads which modules it
imported by the time it exits: a module-level import of a heavy dependency anywhere on a
command's path fails here, not silently in the benchmark."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from runner.contract import with_digest
from tests.support import ROOT, TOY

HEAVY = ("docker", "requests", "urllib3", "cryptography", "kubernetes", "securesystemslib")
"""Third-party packages no command below needs (the docker SDK moves images only; signing
keys are read only for a signed contract or result; the cluster clients only to submit)."""

LIGHT_ONLY = (*HEAVY, "pydantic", "pydantic_core", "jsonschema", "runner.contract")
"""What a command that reads no contract must not import either: ``--help`` and
``--version`` need neither the models nor the schema checks."""

SCRIPT = """\
import atexit, json, sys
out, sys.argv = sys.argv[1], ["runner", *sys.argv[2:]]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
from runner.client import main
main()
"""


def imported(tmp_path: Path, *argv: str) -> tuple[int, set[str]]:
    """The exit code of ``runner ARGV`` in a fresh interpreter, and the modules it imported."""
    out = tmp_path / "modules.json"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RUNNER_SERVER": "off",
        # Nothing answers: `--version` still asks, over the runner's own transport.
        "DOCKER_HOST": f"unix://{tmp_path / 'no-engine.sock'}",
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out), *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    modules: list[str] = json.loads(out.read_text())
    return proc.returncode, set(modules)


def packages(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


@pytest.mark.parametrize(
    "argv",
    [
        ["--version"],
        ["--version", "--json"],
        ["--help"],
        ["verify", "contract", "--help"],
        ["run", "--help"],
        ["job", "--help"],
    ],
)
def test_a_command_that_reads_no_contract_imports_no_models(
    tmp_path: Path, argv: list[str]
) -> None:
    code, modules = imported(tmp_path, *argv)
    assert code == 0
    assert packages(modules, LIGHT_ONLY) == []
    assert "runner.cli" in modules  # the command did run


def test_verify_contract_imports_only_what_verifying_needs(tmp_path: Path) -> None:
    data: dict[str, Any] = json.loads((TOY / "task.json").read_text())
    data["environment"]["image"] = "sha256:" + "ab" * 32
    contract = tmp_path / "task.json"
    contract.write_text(json.dumps(with_digest(data)))
    code, modules = imported(tmp_path, "verify", "contract", str(contract), "--allow-unsigned")
    assert code == 0
    assert "runner.contract.models" in modules and "runner.planning.plan" in modules
    assert packages(modules, HEAVY) == []
    # Nor the parts of a run: the engine, the job folder, the agent's runtime, the signing.
    run_only = (
        "runner.backends.docker",
        "runner.backends.podman",
        "runner.execution",
        "runner.trust.signing",
        "runner.results",
        "runner.egress",
        # Only the parser the contract binds (json.scalar) is imported.
        "runner.parsers.csv_cell",
        "runner.parsers.junit_summary",
        "runner.parsers.regex_scalar",
    )
    assert packages(modules, run_only) == []
    assert "runner.parsers.json_scalar" in modules


def test_a_run_imports_no_slurm_commands_and_no_ctypes(tmp_path: Path) -> None:
    """Every run's options hold Slurm's fence for a takeover (runner.scheduling.slurm.fence),
    which imports the Slurm commands only when a takeover asks it (about 5 ms a start)."""
    data: dict[str, Any] = json.loads((TOY / "task.json").read_text())
    data["environment"]["image"] = "sha256:" + "ab" * 32
    contract = tmp_path / "task.json"
    contract.write_text(json.dumps(with_digest(data)))
    code, modules = imported(
        tmp_path, "run", str(contract), "--allow-unsigned", "--state-dir", str(tmp_path / "s")
    )
    assert code != 0  # no engine answers
    assert {"runner.execution.orchestrator", "runner.scheduling.slurm.fence"} <= modules
    assert (
        packages(modules, ("runner.scheduling.slurm.cluster", "runner.scheduling.slurm.batch"))
        == []
    )
    # Nor ctypes: runner.execution.quotas looked libc up at import with
    # ctypes.util.find_library, which runs /sbin/ldconfig -p in a subprocess.
    assert packages(modules, ("ctypes",)) == []


def _answering(path: Path, code: int, got: list[bytes]) -> threading.Thread:
    """A server at ``path`` that answers one request (kept in ``got``) with exit ``code``."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(1)
    listener.settimeout(60)  # a client that never comes ends the thread, not the suite

    def answer() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                for fd in fds:
                    os.close(fd)
                while not data.endswith(b"\n"):  # a large environment comes in pieces
                    more = conn.recv(1 << 20)
                    if not more:
                        break
                    data += more
                got.append(data)
                conn.sendall(json.dumps({"exit": code}).encode() + b"\n")

    server = threading.Thread(target=answer, daemon=True)
    server.start()
    return server


CLIENT_NEVER = ("runner.cli", "argparse", "socket", "contextlib", "json", "re", "enum",
                "signal", "struct", "pathlib", *LIGHT_ONLY)  # fmt: skip
"""What a client that hands a command to a server imports of none: it speaks through
``_socket``, ``_json``, ``_signal`` and ``_struct`` (``json``, ``signal`` and ``struct``
bring ``re`` and ``enum``). The console script pip writes for the entry point imports
``re`` itself (pyproject.toml says why it stays one), so the client runs here as
``python -c``: what it adds is its own."""

CLIENT = "import sys\nsys.argv[0] = 'runner'\nfrom runner.client import main\nmain()\n"


def test_a_served_command_imports_only_what_its_client_needs(tmp_path: Path) -> None:
    """The client hands a served command to the server and imports nothing of
    :data:`CLIENT_NEVER` on the way, as ``-X importtime`` lists it. The request is the JSON
    the server reads, byte for byte what ``json.dumps`` writes."""
    path, got = tmp_path / "s.sock", []
    server = _answering(path, 7, got)
    env = {**os.environ, "RUNNER_SERVER": str(path), "PYTHONPATH": str(ROOT),
           "ODD": "a\tb\u00e9\\\""}  # fmt: skip
    argv = ["verify", "contract", "task \u00e9\n.json"]
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", CLIENT, *argv], capture_output=True,
        text=True, cwd=tmp_path, timeout=120, check=False, env=env,
    )  # fmt: skip
    server.join(timeout=60)
    assert proc.returncode == 7, proc.stderr[-3000:]
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "runner.client" in imported
    assert packages(imported, CLIENT_NEVER) == []
    request = json.loads(got[0])
    assert request["argv"] == argv and request["env"]["ODD"] == env["ODD"]
    umask = os.umask(0o022)
    os.umask(umask)  # the client's, as this process's
    expected = {"argv": argv, "cwd": str(tmp_path), "env": request["env"], "code": request["code"],
                "umask": umask}  # fmt: skip
    assert got[0] == json.dumps(expected).encode() + b"\n"


def test_the_slurm_step_imports_no_models_while_its_child_ends_by_itself(
    tmp_path: Path,
) -> None:
    """The Slurm batch step (runner.scheduling.slurm.step) only waits for `runner run` in
    every Slurm job: the job folder, the ledger and pydantic are for a child killed by a
    signal alone (about 0.1 s of CPU a job otherwise)."""
    out = tmp_path / "modules.json"
    script = (
        "import atexit, json, sys\n"
        "atexit.register(lambda: open(sys.argv[1], 'w').write(json.dumps(sorted(sys.modules))))\n"
        "from runner.scheduling.slurm.step import main\n"
        "code = main(sys.argv[2:])\n"
        "assert code == 3, code\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(out), "--state-dir", str(tmp_path), "--job-id", "j",
         "--", sys.executable, "-c", "raise SystemExit(3)"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    modules = set(json.loads(out.read_text()))
    assert packages(modules, (*LIGHT_ONLY, "runner.state")) == []


def _patterns(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        return found + [p for v in node.values() for p in _patterns(v)]
    if isinstance(node, list):
        return [p for v in node for p in _patterns(v)]
    return []


def test_no_model_pattern_repeats_a_class_hundreds_of_times() -> None:
    """Every process that builds a model compiles its patterns (pydantic-core's regex engine),
    and a bounded repetition is unrolled: ``[^\\x00]{0,1023}`` over every Unicode character
    cost about 15 ms of each `runner run` and `runner verify`. A length is a ``max_length``
    of its own; a bound of up to 255 on an ASCII class costs well under a millisecond."""
    big = re.compile(r"\{\d*,?(\d+)\}")
    slow = [
        f"{schema.name}: {pattern}"
        for schema in sorted((ROOT / "contracts").glob("*.schema.json"))
        for pattern in _patterns(json.loads(schema.read_text()))
        if any(int(m.group(1)) > 255 for m in big.finditer(pattern))
    ]
    assert len(list((ROOT / "contracts").glob("*.schema.json"))) >= 5
    assert slow == []
