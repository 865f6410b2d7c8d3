"""The eleventh hostile review (staging the runner's own inputs with the contract's, 4ad81ec),
and what it found of older code: kept closed. No engine.

A contract names its inputs' paths; the runner writes files of its own into ``input/`` beside
them. An input may never take one of their names: the job would read the runner's file where
the contract bound its own, and the listing checked after the job would hold only one of
them, so nothing would say so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runner.app import issuer
from runner.contract import Trust, load_contract
from runner.core.errors import ContractError
from runner.staging import jobdir as staging
from tests.support import FAKE_IMAGE_ID, write_contract

pytestmark = pytest.mark.hostile


OWN = ("task.json", "task.dsse.json", "parser-catalog.json", "result.schema.json",
       "compute-decision.json", "agent-prompt.md")  # fmt: skip
"""Every file the runner writes into ``input/``."""


@pytest.mark.parametrize("name", OWN)
def test_no_input_takes_the_name_of_a_file_the_runner_writes_into_input(
    tmp_path: Path, name: str
) -> None:
    """Each of the runner's own names in ``input/``, as a signed contract's paper, is refused
    before anything is staged. ``task.dsse.json`` was not among them: a signed contract's
    paper of that name was overwritten by the contract's signed envelope, listed twice in
    the manifest and once in the listing, and the check after the job passed."""
    folder = tmp_path / "c"
    folder.mkdir()
    contract = write_contract(folder, FAKE_IMAGE_ID, change=lambda d: d["paper"].update(path=name))
    if not (folder / name).exists():  # task.json is the contract itself
        shutil.copy(folder / "paper.md", folder / name)
    pair = issuer.keygen(tmp_path / "keys" / "issuer")
    signed = issuer.sign(contract, pair.private_key, output=folder / "signed.dsse.json")
    keys = tmp_path / "trusted"
    keys.mkdir()
    (keys / "issuer.pub").write_bytes(pair.public_key.read_bytes())
    loaded = load_contract(signed.envelope, Trust(folder=keys))
    assert loaded.signature is not None
    with pytest.raises(
        ContractError, match="would overwrite the input folder or a file the runner"
    ):
        staging.stage_inputs(staging.prepare(tmp_path / "job"), loaded)


def test_every_file_the_runner_writes_into_input_is_reserved() -> None:
    assert set(OWN) <= set(staging.RUNNER_INPUTS)
