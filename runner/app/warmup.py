"""Warming a process that commands or jobs are forked from (``runner serve``, a batch).

Its own module so that the server and the batch share it without importing each other: the
batch is handed :func:`warm_up` by its caller, and the list below may name the batch.
"""

from __future__ import annotations

import contextlib

from runner.core import collector

__all__ = ["warm_up"]


def warm_up() -> None:
    """Import everything a command imports, even lazily, and ask the engine what does not
    change, so that no command forked from this process pays for it (a server's or a
    batch's); then freeze it out of the collector's sight, so that the forks share its pages
    instead of copying them (the documented use of gc.freeze before fork)."""
    import codecs
    import gc

    import ijson  # type: ignore[import-untyped]  # noqa: F401
    import platformdirs  # noqa: F401

    from runner import backends
    from runner.agents import transcript  # noqa: F401  # imported by a job that uses it only
    from runner.app import batch  # noqa: F401
    from runner.caches import assets  # noqa: F401
    from runner.contract import load  # noqa: F401
    from runner.core.errors import RunnerError
    from runner.egress import proxylog, slots  # noqa: F401
    from runner.evidence import read as evidence  # noqa: F401
    from runner.execution import (
        orchestrator,  # noqa: F401
        sweeper,  # noqa: F401
    )
    from runner.gpu import cdi, gpus, usage  # noqa: F401
    from runner.models import selfreport
    from runner.parsers import registry
    from runner.planning import (
        plan,  # noqa: F401
        policy,  # noqa: F401
    )
    from runner.results import attest  # noqa: F401
    from runner.scheduling.slurm import fence  # noqa: F401  # every run's options hold one

    # Codecs a job looks up by name (RFC 8785 sorts keys by their UTF-16 code units; the boot
    # id is read as ASCII): each lookup imports its module on first use.
    for name in ("utf-16-be", "ascii"):
        codecs.lookup(name)
    selfreport.schema_bytes()  # staged into every job's input/
    registry.catalog_json()  # staged into every job's input/ too
    for parser_id, version in registry.available():
        with contextlib.suppress(RunnerError):  # a broken plug-in schema: its binding says so
            registry.compiled_validator(parser_id, version)
    with contextlib.suppress(RunnerError):  # an engine that is down: each command says so
        backends.default().architecture()  # the engine's API version and host, asked once
    gc.freeze()
    collector.resume()  # held off since the process started, when it was (a no-op else)
