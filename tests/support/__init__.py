"""Test support: ``jobs`` (contracts, the engine, `runner run` in this session) and
``hostile`` (the hostile suite's measured runs). What the benchmark shares with the tests (the
contract writer, the docker CLI helper) lives in :mod:`runner.testing` and is re-exported."""

from runner.testing import (
    IMAGE,
    TOY,
    copy_toy_inputs,
    docker,
    json_measurement,
    toy_data,
    write_contract,
)
from tests.support.jobs import (
    FAKE_IMAGE_ID,
    ROOT,
    SEED,
    SESSION_ID,
    SESSION_LABEL,
    building_the_tree,
    contract_data,
    run_cli,
    run_job,
    running_containers,
    session_containers,
    signal_when_running,
    start_job,
    toy_input_digests,
    wait_running,
)

__all__ = [
    "FAKE_IMAGE_ID",
    "IMAGE",
    "ROOT",
    "SEED",
    "SESSION_ID",
    "SESSION_LABEL",
    "TOY",
    "building_the_tree",
    "contract_data",
    "copy_toy_inputs",
    "docker",
    "json_measurement",
    "run_cli",
    "run_job",
    "running_containers",
    "session_containers",
    "signal_when_running",
    "start_job",
    "toy_data",
    "toy_input_digests",
    "wait_running",
    "write_contract",
]
