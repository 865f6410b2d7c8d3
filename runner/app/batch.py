"""Many contracts in one ``runner run``: each job in its own process, forked from a warm one.

Platform workers launch thousands of short jobs, and a fresh runner process spends most of its
own time importing (pydantic and its models, cryptography) before it reaches the engine. A
batch pays that once: this process imports everything a job needs, then forks one child per
contract, at most ``parallel`` at a time. A child is exactly a single ``runner run``: its own
job lock, ledger, container, envelope and signal handling; nothing is shared between jobs but
the memory pages the fork copies on write. A child that dies without a word (killed, a runner
bug) still gets an envelope here, ``infrastructure``, naming how it ended.

SIGINT and SIGTERM to the batch are passed to every running job, which stops its container
and ends ``cancelled`` as a single run does; contracts not yet started end ``cancelled``
without running.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from runner.core.errors import Category
from runner.execution import orchestrator
from runner.models.envelope import Failure

__all__ = ["run_many"]

_STOPS = {signal.SIGINT, signal.SIGTERM}


def _warm_up(options: orchestrator.RunOptions, warm_up: Callable[[], None]) -> None:
    """Warm this process for forking (``warm_up``: runner.app.warmup.warm_up, as the CLI gives
    it), with the runner's key made first so that no two jobs race to make it."""
    from runner.results import attest

    if options.result_key is not None:
        attest.runner_key(options.result_key)
    warm_up()


def _child(path: Path, options: orchestrator.RunOptions, out: Path) -> None:
    """Run one job and leave its envelope at ``out``; never returns."""
    code = 70  # EX_SOFTWARE, when even the envelope could not be written
    try:
        from runner.app.host import install_signal_handlers

        install_signal_handlers()  # as a single run: the first signal stops the job cleanly
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)  # held since before the fork
        envelope = orchestrator.run(path, options)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(orchestrator.as_json(envelope)))
        tmp.replace(out)
        code = 0
    except BaseException:  # noqa: BLE001 - reported by the parent as this job's failure
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _lost(path: Path, how: str) -> dict[str, Any]:
    reason = (
        f"the runner process for {path} {how} before writing an envelope (a runner bug or "
        "an outside kill); its job folder and ledger say what became of the job"
    )
    failure = Failure(
        category=Category.INFRASTRUCTURE, stage="container", retryable=True, reason=reason
    )
    return orchestrator.as_json(orchestrator.ended_early(failure))


def _cancelled(path: Path) -> dict[str, Any]:
    reason = f"the batch was stopped before {path} started; nothing ran"
    failure = Failure(category=Category.CANCELLED, stage="contract", retryable=True, reason=reason)
    return orchestrator.as_json(orchestrator.ended_early(failure))


def _stop(running: dict[int, int]) -> None:
    """Stop the jobs still ``running`` (pid -> index) as a SIGTERM to the batch does (each
    stops its container and ends ``cancelled``), and wait for them."""
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    for pid in list(running):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        running.pop(pid)


def run_many(
    paths: list[Path],
    options: orchestrator.RunOptions,
    *,
    parallel: int,
    on_done: Callable[[int, Path, dict[str, Any]], None] = lambda i, p, d: None,
    warm_up: Callable[[], None] = lambda: None,
) -> list[dict[str, Any]]:
    """Run every contract, at most ``parallel`` at once; their envelopes (as JSON data), in
    the order of ``paths``. ``on_done(index, path, data)`` is called as each one ends.
    ``warm_up`` readies this process before the forks (runner.app.warmup.warm_up: every import
    done once, not once per job)."""
    _warm_up(options, warm_up)
    results: list[dict[str, Any] | None] = [None] * len(paths)
    running: dict[int, int] = {}  # pid -> index
    stopping = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(running):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    folder = Path(tempfile.mkdtemp(prefix="runner-batch-"))
    try:
        queue = list(range(len(paths)))
        while queue or running:
            while queue and not stopping and len(running) < max(parallel, 1):
                index = queue.pop(0)
                sys.stdout.flush()
                sys.stderr.flush()
                # Held across the fork: one landing in the child before its own handlers
                # would run this process's forward() there, and stop the other jobs.
                signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
                try:
                    pid = os.fork()
                    if pid == 0:
                        _child(paths[index], options, folder / f"{index}.json")  # never returns
                    running[pid] = index
                finally:  # a fork that failed (EAGAIN) too: Ctrl-C must still reach the batch
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
            if stopping:
                for index in queue:
                    results[index] = _cancelled(paths[index])
                    on_done(index, paths[index], results[index] or {})
                queue = []
            if not running:
                break
            pid, status = os.wait()
            if pid not in running:  # another child of this process (a server that a client
                continue  # started with RUNNER_AUTOSERVE, say): not a job's
            index = running.pop(pid)
            out = folder / f"{index}.json"
            if out.exists():
                data: dict[str, Any] = json.loads(out.read_text())
            elif os.WIFSIGNALED(status):
                data = _lost(paths[index], f"was killed by signal {os.WTERMSIG(status)}")
            else:
                data = _lost(paths[index], f"exited {os.WEXITSTATUS(status)}")
            results[index] = data
            on_done(index, paths[index], data)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            _stop(running)  # left by an error of this loop: stopped, not orphaned; a second
        finally:  # Ctrl-C stops the waiting (the jobs were told to stop)
            shutil.rmtree(folder, ignore_errors=True)
    return [r or _cancelled(p) for r, p in zip(results, paths, strict=True)]
