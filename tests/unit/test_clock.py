"""The clock seam (:mod:`runner.core.clock`): the real clock by default, reading the host's
clocks; a test's clock only inside ``use``, the previous one back after it, even when the
block raises; the virtual clock's sleeps pass at once and are recorded."""

from __future__ import annotations

import time
from datetime import UTC, timedelta

import pytest

from runner.core import clock
from tests.support.clock import VirtualClock


def test_the_default_is_the_hosts_clocks() -> None:
    assert isinstance(clock.current(), clock.RealClock)
    before = time.monotonic()
    now = clock.monotonic()
    assert before <= now <= time.monotonic()
    wall = clock.now()
    assert wall.tzinfo is UTC
    start = time.monotonic()
    clock.sleep(0.02)
    assert time.monotonic() - start >= 0.02  # really slept


def test_a_clock_is_used_only_inside_the_block() -> None:
    virtual = VirtualClock()
    with pytest.raises(RuntimeError), clock.use(virtual):
        assert clock.current() is virtual
        raise RuntimeError
    assert isinstance(clock.current(), clock.RealClock)


def test_the_virtual_clock_moves_only_when_someone_sleeps(virtual_clock: VirtualClock) -> None:
    mono, wall = clock.monotonic(), clock.now()
    assert clock.monotonic() == mono and clock.now() == wall
    start = time.monotonic()
    clock.sleep(3600)
    assert time.monotonic() - start < 1, "no real sleep"
    virtual_clock.advance(1.5)
    assert clock.monotonic() - mono == pytest.approx(3601.5)
    assert clock.now() - wall == timedelta(seconds=3601.5)  # both move together
    assert virtual_clock.sleeps == [3600] and virtual_clock.elapsed == pytest.approx(3601.5)
    with pytest.raises(ValueError, match="non-negative"):
        clock.sleep(-1)  # as time.sleep
