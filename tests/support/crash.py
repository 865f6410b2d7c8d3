"""A runner that dies mid-run, for the fake engine: a progress sink that freezes the fake
engine (nothing of the runner runs on) and raises at the first tick of a running container."""

from __future__ import annotations

from runner.backends.fake import FakeBackend


class Crash(BaseException):
    """The runner process dying (kill -9): nothing of it runs on."""


class CrashingProgress:
    """Progress that kills the runner at the first tick of a running container when given
    the fake engine (which it freezes first); quiet otherwise."""

    def __init__(self, fake: FakeBackend | None = None) -> None:
        self.fake = fake

    def stage(self, name: str, detail: str) -> None:
        pass

    def running(self, elapsed: float, budget: float) -> None:
        if self.fake is not None:
            self.fake.frozen = True
            raise Crash

    def transfer(self, label: str, done: int, total: int) -> None:
        pass
