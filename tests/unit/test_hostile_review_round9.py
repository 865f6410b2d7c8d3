"""The ninth hostile review (a job that ends by itself charged to the engine's FinishedAt):
what it found, kept closed. No engine: the fake backend, its answers changed as an odd or
hostile engine could."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runner.backends.base import ContainerState
from runner.backends.fake import FakeBackend, FakeJob
from runner.state.ledger import parse_time
from tests.support.budget import COUNTING
from tests.unit.test_orchestrator_fake import (
    _contract,
    _crash_mid_run,
    _image,
    _ledger_seconds,
    _options,
    _run,
    _writes,
)

pytestmark = pytest.mark.hostile

ODD_TIMES: list[Any] = [
    "2026-12-06T05:02:51",  # no time zone
    "2026-12-06",  # a date alone
    1733461371,  # a number
    ["2026-12-06T05:02:51Z"],
    "9999-12-31T23:59:59Z",
    "not a time",
]


@pytest.mark.parametrize("odd", ODD_TIMES)
def test_parse_time_takes_only_a_zoned_time(odd: Any) -> None:
    """A time with no zone compared with this host's clock raised TypeError, a number
    AttributeError: either is no time."""
    assert parse_time(odd) is None or parse_time(odd).tzinfo is not None  # type: ignore[union-attr]


def _odd_engine(odd: Any) -> FakeBackend:
    engine = FakeBackend(jobs=FakeJob(seconds=2.0, work=_writes()))
    engine.add_image()
    real = engine.state

    def state(container_id: str) -> ContainerState:
        st = real(container_id)
        return ContainerState.from_engine(
            {**st.raw, "StartedAt": odd, "FinishedAt": odd}, container_id
        )

    engine.state = state  # type: ignore[method-assign]
    return engine


@pytest.mark.parametrize("odd", ODD_TIMES)
def test_an_engines_odd_times_neither_crash_a_run_nor_shrink_its_charge(
    tmp_path: Path, odd: Any
) -> None:
    """An engine answering StartedAt and FinishedAt with no zone, a bare date, a number or a
    far future: a naive StartedAt escaped the start (TypeError), leaving the container running
    with no runner watching it. Now such a time is no time: the run ends, charged from the
    start call to the moment the runner learnt of the end, never less than it ran."""
    engine = _odd_engine(odd)
    env = _run(_contract(tmp_path, _image(engine)), _options(tmp_path), engine)
    assert env["status"] == "succeeded", env.get("failure")
    assert 2.0 - COUNTING <= _ledger_seconds(tmp_path, env) <= 2.1


@pytest.mark.parametrize("odd", ODD_TIMES[:3])
def test_a_reattach_to_an_engine_with_odd_times(tmp_path: Path, odd: Any) -> None:
    """The same answers on a reattach (the runner killed mid-run): recover compared the
    engine's StartedAt with the ledger's times and raised on a naive one, so the job could
    never be reattached."""
    engine = FakeBackend(jobs=FakeJob(seconds=2.0, work=_writes()))
    engine.add_image()
    contract = _contract(tmp_path, _image(engine))
    _crash_mid_run(contract, tmp_path, engine)
    odd_engine = _odd_engine(odd)
    odd_engine.__dict__.update({k: v for k, v in engine.__dict__.items() if k != "state"})
    env = _run(contract, _options(tmp_path), odd_engine)
    assert env["status"] == "succeeded", env.get("failure")
    assert _ledger_seconds(tmp_path, env) >= 2.0 - COUNTING
