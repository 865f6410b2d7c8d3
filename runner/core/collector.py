"""Python's cyclic garbage collector, held off while a `runner` process starts.

Importing the runner creates some hundred thousand objects (pydantic's schemas, dataclasses,
modules), and the collector walked the young ones again each time 700 more had been made
than freed: about 70 collections and 12-20 ms of a `runner verify` or a fresh `runner run`
(measured; see docs/development/benchmarks.md), for objects that live as long as the
process. The ``runner`` program (:func:`runner.client.main` given no arguments, as its
script and ``python -m runner`` call it) calls :func:`pause` first; :func:`resume` freezes
what exists then (moved out of the collector's sight for good, as a warm process's
``gc.freeze()`` before its forks: cycles made while paused are never freed, 94 objects in a
run) and lets the collector run again for all that comes after.

``runner run`` resumes once its imports are done, before its job; ``runner verify contract``
when it ends (the program's last step, whatever the command); every other command before it
starts (:func:`runner.cli.dispatch`); a warm process's warm-up (:mod:`runner.app.warmup`)
before its forks. A program that embeds the runner, or calls ``main`` with arguments, never
pauses, so nothing of its heap is ever frozen by the runner.
"""

from __future__ import annotations

import gc

__all__ = ["pause", "resume"]

_paused = False


def pause() -> None:
    """Hold the collector off (a no-op when it is already off: another's choice)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """Let a collector :func:`pause` held off run again, the objects made while it was held
    off frozen first, so that it never walks them; a no-op otherwise."""
    global _paused
    if _paused:
        gc.freeze()
        gc.enable()
        _paused = False  # last: a Ctrl-C before it leaves it to the entry's own resume
