"""The lease of a watched attempt: its container is removed once no heartbeat could be
written for too long (:class:`Lease`), so that two containers of one job never run at once."""

from __future__ import annotations

import contextlib
import threading

from runner.backends.base import Backend
from runner.core import clock
from runner.core.errors import JobFenced

__all__ = ["Lease"]


class Lease:
    """A thread that removes the container once no heartbeat has been written for ``lease``
    seconds: when writing to the ledger hangs (a network filesystem cut off from its server)
    the watching loop hangs with it, and this is what still stops the job. A runner on another
    host takes such a job over only after two leases without a heartbeat
    (``runner.execution.takeover``),
    by when this thread has removed the container."""

    def __init__(self, backend: Backend, container_id: str, lease: float) -> None:
        self.backend, self.container_id, self.lease = backend, container_id, lease
        self.last_ok = clock.monotonic()
        self.fired = self.removed = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runner-lease", daemon=True)
        if lease > 0:
            self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(min(1.0, self.lease / 10)):
            if clock.monotonic() - self.last_ok > self.lease:
                self.fired = True
                self._remove()
                return

    def _remove(self) -> None:
        """Remove the container, again and again until the engine says it is gone (an engine
        that does not answer now may in a second); stops when the runner does."""
        while True:
            try:
                self.backend.remove(self.container_id)
                self.removed = True
                return
            except Exception:  # noqa: BLE001 - any failure: try again
                if self._done.wait(1.0):
                    return

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def lost(self) -> JobFenced:
        if not self.removed:  # one last try, in this thread, before saying so
            with contextlib.suppress(Exception):
                self.backend.remove(self.container_id)
                self.removed = True
        done = (
            "the runner removed the job's container"
            if self.removed
            else f"the runner could NOT remove the job's container {self.container_id} (the "
            "engine did not answer): remove it by hand before the job runs anywhere else"
        )
        return JobFenced(
            f"no heartbeat could be written to the job's ledger for {self.lease:.0f} s, so "
            f"{done}: past that, a runner on another host may take the job over, and two "
            "containers of one job must never run at once",
            hint="check the state folder's storage; run the contract again to continue the "
            "same budget (the attempt is charged up to now)",
        )
