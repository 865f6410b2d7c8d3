"""runner/app/issuer.py as a library: what `runner keygen` and `runner sign` do, without the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from runner.app import issuer
from runner.contract import Trust, load_contract
from runner.core.errors import ContractError, RefusedError
from tests.support import TOY, contract_data, copy_toy_inputs, run_cli


def test_keygen_and_sign_return_what_they_wrote(tmp_path: Path) -> None:
    pair = issuer.keygen(tmp_path / "issuer")
    assert pair.private_key == tmp_path / "issuer.key" and pair.private_key.exists()
    assert pair.public_key == tmp_path / "issuer.pub" and pair.public_key.exists()
    with pytest.raises(RefusedError, match="already exists"):
        issuer.keygen(tmp_path / "issuer")

    contract = copy_toy_inputs(tmp_path) / "task.json"
    contract.write_text(json.dumps(contract_data(issuedAt=None, expiresAt=None)))
    signed = issuer.sign(
        contract,
        pair.private_key,
        expires_in=timedelta(hours=2),
        audience=["lab-a"],
        job_id="signed-job-1",
    )
    assert signed.envelope == tmp_path / "task.dsse.json" and signed.envelope.exists()
    assert signed.key_id == pair.key_id
    assert signed.audience == ["lab-a"] and signed.job_id == "signed-job-1"
    assert signed.issued_at and signed.expires_at
    lifetime = datetime.fromisoformat(signed.expires_at) - datetime.fromisoformat(signed.issued_at)
    assert lifetime == timedelta(hours=2)

    keys = tmp_path / "trusted"
    keys.mkdir()
    (keys / "issuer.pub").write_bytes(pair.public_key.read_bytes())
    verified = load_contract(signed.envelope, Trust(folder=keys))
    assert verified.digest == signed.contract_digest
    assert verified.signature is not None and list(verified.signature.keyids) == [pair.key_id]


def test_sign_refusals(tmp_path: Path) -> None:
    pair = issuer.keygen(tmp_path / "issuer")
    contract = copy_toy_inputs(tmp_path) / "task.json"
    contract.write_text(json.dumps(contract_data(issuedAt=None, expiresAt=None)))
    with pytest.raises(issuer.BadDuration, match="90s, 30m, 24h or 7d"):
        issuer.sign(contract, pair.private_key, expires_in="soon")
    assert issuer.parse_duration("90s") == timedelta(seconds=90)
    assert issuer.parse_duration("7d") == timedelta(days=7)
    signed = issuer.sign(contract, pair.private_key, expires_in="1h")
    with pytest.raises(RefusedError, match="already a signed envelope"):
        issuer.sign(signed.envelope, pair.private_key)
    with pytest.raises(ContractError, match="cannot read"):
        issuer.sign(tmp_path / "missing.json", pair.private_key)


@pytest.mark.parametrize("lifetime", ["infh", "nanh", "0s", "-1h", "4000d"])
def test_a_lifetime_that_is_no_lifetime_is_a_usage_error(tmp_path: Path, lifetime: str) -> None:
    proc = run_cli(
        "sign", str(TOY / "task.json"), "--key", str(tmp_path / "none.key"),
        f"--expires-in={lifetime}",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "lifetime" in proc.stderr and "Traceback" not in proc.stderr


def test_a_file_that_cannot_be_written_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    target = tmp_path / "missing-folder" / "pinned.json"
    proc = run_cli("pin", str(TOY / "task.json"), "-o", str(target))
    assert proc.returncode == 4, proc.stderr
    assert f"runner: infrastructure: {target}: No such file or directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_reader_that_goes_away_is_no_error() -> None:
    """`runner parsers | head -1`: stdout's reader is gone before the runner writes; exit 0,
    and nothing about a broken pipe on stderr."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "runner", "parsers"], stdout=write, stderr=subprocess.PIPE,
            text=True, check=False,
        )  # fmt: skip
    finally:
        os.close(write)
    assert done.returncode == 0, done.stderr
    assert "pipe" not in done.stderr.lower(), done.stderr
