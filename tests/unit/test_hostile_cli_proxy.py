"""Regression tests for issue 25's items 8 to 10: one meaning per key flag (``--trusted-keys``
names issuer keys on every command; result signers are ``--result-keys``) and
``runner verify-result`` re-parsing each value from its evidence; the egress proxy refusing the
header lines RFC 9112 says to refuse; ``runner cleanup`` acting on one state folder only.

The verify-result and cleanup cases use the real engine (a toy run, real egress slots); the
proxy's cases run the proxy program itself on loopback, as
tests/integration/test_egress_proxy.py does, with its fixture.

The tests that need the engine or the proxy program are in
tests/integration/test_hostile_cli_proxy.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.egress import slots as egress
from runner.execution import sweeper
from tests.unit.test_egress import PLAN, _fake

# --------------------------------------------------------- 10. cleanup of one state folder


@pytest.mark.hostile
def test_a_slot_from_before_the_state_label_is_left_alone(tmp_path: Path) -> None:
    """Slots made before they carried their state folder (org.runner.state-dir) are neither
    removed nor listed by cleanup (their own folder's runners still reap them when idle)."""
    fake, state = _fake(), tmp_path / "state"
    old = egress.lease(fake, PLAN, "runner-j-a1", state)
    new = egress.lease(fake, PLAN, "runner-k-a1", state)
    egress.release(old)
    egress.release(new)
    for c in fake.containers.values():
        if c.spec.labels[egress.SLOT] == old.slot:
            c.spec.labels.pop(egress.STATE)
            assert c.spec.labels[egress.LOCK].startswith(str(state))
    report = sweeper.sweep(fake, state_dir=state, dry_run=True)
    assert [x["name"] for x in report["wouldRemove"]] == [new.slot]
    report = sweeper.sweep(fake, state_dir=state)
    assert [x["name"] for x in report["removed"]] == [new.slot]
    assert {c.spec.labels[egress.SLOT] for c in fake.containers.values()} == {old.slot}
    assert egress.reap(fake, idle_seconds=0.0, folder=egress.pool_dir(state)) == [old.slot]
