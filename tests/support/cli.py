"""``python -m runner`` for the tests, forked from a pre-imported helper process (a zygote).

A fresh ``python -m runner`` spends about half a second importing (pydantic and the models,
cryptography, the docker SDK) before it does anything; the unit suite starts about 120 of them.
:func:`run` hands the command line to one helper process per test process instead
(tests/support/zygote.py, started at first use), which has imported the runner's command line
and every command's module once, and forks a child per command: a real process of its own (its
own pid; signals reach it), whose environment is exactly the one given, in the working
directory given, with stdin, stdout and stderr the files given, running the runner's real entry
point as ``python -m runner`` does and ending as the interpreter does (the caller's umask too).

A fresh interpreter is still started, as before, when the fork could differ from one: the
request's environment changes what Python reads at its start (``PYTHON*``, the locale's
``LANG``/``LC_ALL``/``LC_CTYPE``, ``HOME`` where the user site is on,
``PYDANTIC_DISABLE_PLUGINS``), or its working directory would make a fresh one import another
``runner`` (a package of its own, at ``sys.path[0]``); and for good when the zygote cannot be
started or dies (said once on stderr). ``TESTS_RUNNER_ZYGOTE=off`` keeps every command in a
fresh interpreter.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["Forked", "popen", "run", "zygote_pid"]

SERVER = Path(__file__).with_name("zygote.py")
ROOT = SERVER.parent.parent.parent.resolve()

_BASE_ENV = dict(os.environ)
"""The test process's environment when this module was imported (before any test changed it):
the zygote's own, and what a request's start-up variables are compared with."""


def _startup_vars(env: dict[str, str], user_site: bool) -> dict[str, str | None]:
    """What of ``env`` a fresh interpreter reads at its start (or the zygote at its imports)."""
    names = {k for k in env if k.startswith("PYTHON")} | {"LANG", "LC_ALL", "LC_CTYPE"}
    if user_site:
        names.add("HOME")
    chosen: dict[str, str | None] = {name: env.get(name) for name in names}
    chosen["PYDANTIC_DISABLE_PLUGINS"] = env.get("PYDANTIC_DISABLE_PLUGINS", "__all__")
    return chosen


class ZygoteGone(Exception):
    """The zygote did not take the request (not started, or gone): run a fresh interpreter."""


class _Zygote:
    def __init__(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ctl = mine
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=_BASE_ENV,
            cwd=ROOT,
        )
        theirs.close()
        mine.settimeout(120)
        try:
            ready = json.loads(mine.recv(4096) or b"{}")
        except (OSError, ValueError) as exc:
            raise ZygoteGone(f"it did not start ({exc!r})") from None
        finally:
            mine.settimeout(None)
        if not ready.get("ready"):
            raise ZygoteGone(f"it exited at its start ({self.proc.poll()})")
        self.startup = _startup_vars(_BASE_ENV, bool(ready.get("userSite")))
        self.user_site = bool(ready.get("userSite"))
        self.runner = str(ready.get("runner"))
        self.runner_elsewhere = ready.get("runnerElsewhere")
        atexit.register(self.close)

    def close(self) -> None:
        """End the zygote (its empty message); commands still running go on by themselves."""
        with contextlib.suppress(OSError):
            self.ctl.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def fits(self, env: dict[str, str], cwd: str) -> bool:
        """Whether a fork runs ``env``/``cwd`` exactly as a fresh interpreter would."""
        if _startup_vars(env, self.user_site) != self.startup:
            return False
        where = Path(cwd).resolve()
        if where == ROOT:  # the zygote's own folder
            return True
        if (where / "runner").exists():  # sys.path[0]: a fresh one imports that runner
            return (where / "runner" / "__init__.py").resolve() == Path(self.runner).resolve()
        return self.runner_elsewhere == self.runner

    def start(
        self, argv: list[str], env: dict[str, str], cwd: str, stdio: list[int], module: str
    ) -> _Child:
        mine, theirs = socket.socketpair()
        try:
            with self.lock:
                try:
                    socket.send_fds(self.ctl, [b"r"], [theirs.fileno(), *stdio])
                except OSError as exc:
                    raise ZygoteGone(f"it is gone ({exc!r})") from None
            theirs.close()
            umask = os.umask(0o077)
            os.umask(umask)
            request = {"argv": argv, "env": env, "cwd": cwd, "module": module, "umask": umask}
            child = _Child(mine)
            try:
                mine.sendall(json.dumps(request).encode() + b"\n")
                line = child.line()
            except OSError:
                line = b""
            if not line:
                raise ZygoteGone(f"it did not answer (exit {self.proc.poll()})")
        except BaseException:
            theirs.close()
            mine.close()
            raise
        child.pid = int(json.loads(line)["pid"])
        return child


class _Child:
    """A command running in a fork of the zygote: its pid, and its exit code once it ends."""

    def __init__(self, conn: socket.socket) -> None:
        self.pid = 0
        self.conn = conn
        self.buffered = b""
        self.returncode: int | None = None

    def line(self, timeout: float | None = None) -> bytes:
        """The zygote's next line about this child (b"" when the zygote is gone)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffered:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self.conn.settimeout(left)  # 0: one look, without waiting
            try:
                chunk = self.conn.recv(4096)
            except BlockingIOError:
                raise TimeoutError from None
            if not chunk:
                return b""
            self.buffered += chunk
        line, self.buffered = self.buffered.split(b"\n", 1)
        return line + b"\n"

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (a negative one: killed by that signal); TimeoutError past ``timeout``."""
        if self.returncode is not None:
            return self.returncode
        try:
            line = self.line(timeout)
        except TimeoutError:
            raise
        except OSError:
            line = b""
        if not line:
            raise RuntimeError(
                f"the test zygote went away while `runner` (pid {self.pid}) ran: its exit code "
                "is unknown"
            )
        self.returncode = int(json.loads(line)["exit"])
        self.conn.close()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


_lock = threading.Lock()
_zygote: _Zygote | None = None
_broken: str | None = None


def _get() -> _Zygote | None:
    global _zygote, _broken
    if os.environ.get("TESTS_RUNNER_ZYGOTE", "").lower() in {"off", "0", "no", "false"}:
        return None
    with _lock:
        if _zygote is None and _broken is None:
            try:
                _zygote = _Zygote()
            except (OSError, ZygoteGone) as exc:
                _give_up(f"{exc}")
        return _zygote


def _give_up(why: str) -> None:
    global _zygote, _broken
    if _broken is None:
        _broken = why
        print(
            f"tests/support/cli.py: the runner zygote cannot be used ({why}); every later "
            "`runner` command runs in a fresh `python -m runner`",
            file=sys.stderr,
        )
    if _zygote is not None:
        _zygote.close()
        _zygote = None


def zygote_pid() -> int | None:
    """The zygote's pid, started if need be (None: not in use)."""
    zygote = _get()
    return zygote.proc.pid if zygote is not None else None


def _text(data: bytes) -> str:
    """As ``subprocess.run(text=True)`` decodes: the locale's encoding, universal newlines."""
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def run(
    args: list[str],
    *,
    env: dict[str, str],
    cwd: str | os.PathLike[str] | None = None,
    input: str | None = None,
    timeout: float | None = None,
    module: str = "runner",
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, "-m", "runner", *args], capture_output=True,
    text=True, env=env, cwd=cwd, input=input, timeout=timeout)``, in a fork of the zygote when
    that is the same (see the module's docstring). ``env`` is the whole environment. ``module``
    (another ``python -m`` module, already importable or in ``cwd``) is for the zygote's own
    tests."""
    cmd = [sys.executable, "-m", module, *args]
    where = os.fspath(cwd) if cwd is not None else os.getcwd()
    zygote = _get()
    if zygote is None or not zygote.fits(env, where):
        return subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd=cwd, input=input,
            timeout=timeout, check=False,
        )  # fmt: skip
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(tempfile.TemporaryFile())
        err = stack.enter_context(tempfile.TemporaryFile())
        if input is None:
            stdin: IO[Any] = stack.enter_context(open(os.devnull, "rb"))
        else:
            stdin = stack.enter_context(tempfile.TemporaryFile())
            stdin.write(input.encode(locale.getpreferredencoding(False)))
            stdin.seek(0)
        started = time.monotonic()
        try:
            stdio = [stdin.fileno(), out.fileno(), err.fileno()]
            child = zygote.start(args, env, where, stdio, module)
        except ZygoteGone as exc:
            _give_up(str(exc))
            return run(args, env=env, cwd=cwd, input=input, timeout=timeout, module=module)
        try:
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
            code = child.wait(left)
        except TimeoutError:
            child.kill()
            child.wait()
            out.seek(0)
            err.seek(0)
            # As subprocess.run on POSIX: the output so far, as bytes.
            raise subprocess.TimeoutExpired(
                cmd, timeout or 0.0, output=out.read(), stderr=err.read()
            ) from None
        except BaseException:
            child.kill()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, code, _text(out.read()), _text(err.read()))


class Forked:
    """What ``subprocess.Popen(cmd, stdout=PIPE, stderr=PIPE, text=True, env=env)`` gives, for a
    command forked from the zygote: ``args``, ``pid``, ``returncode``, ``stdout`` and ``stderr``
    (text pipes, universal newlines), ``poll``, ``wait``, ``communicate``, ``send_signal``,
    ``terminate``, ``kill``; stdin is /dev/null."""

    def __init__(self, args: list[str], child: _Child, stdout: int, stderr: int) -> None:
        encoding = locale.getpreferredencoding(False)
        self.args = args
        self.pid = child.pid
        self.stdin = None
        self.stdout: IO[str] = open(stdout, encoding=encoding)  # noqa: SIM115 - closed by communicate
        self.stderr: IO[str] = open(stderr, encoding=encoding)  # noqa: SIM115
        self.returncode: int | None = None
        self._child = child
        self._readers: list[threading.Thread] = []
        self._read: dict[str, str] = {}

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(TimeoutError):
                self.returncode = self._child.wait(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self.returncode = self._child.wait(timeout)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0) from None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(
        self,
        input: str | None = None,
        timeout: float | None = None,
    ) -> tuple[str, str]:
        """Read stdout and stderr to their ends and wait for the exit, as Popen.communicate;
        ``subprocess.TimeoutExpired`` past ``timeout`` (call it again to go on reading)."""
        if input:
            raise ValueError("a forked command's stdin is /dev/null")
        if not self._readers:
            for name, stream in (("stdout", self.stdout), ("stderr", self.stderr)):
                reader = threading.Thread(target=self._drain, args=(name, stream), daemon=True)
                reader.start()
                self._readers.append(reader)
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._read.get("stdout", ""), self._read.get("stderr", "")

    def _drain(self, name: str, stream: IO[str]) -> None:
        try:
            self._read[name] = stream.read()
        finally:
            stream.close()

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr):
            with contextlib.suppress(OSError):
                stream.close()
        self.wait()


def popen(
    args: list[str],
    *,
    env: dict[str, str],
    cwd: str | os.PathLike[str] | None = None,
    module: str = "runner",
) -> Forked | subprocess.Popen[str]:
    """``subprocess.Popen([sys.executable, "-m", "runner", *args], stdout=PIPE, stderr=PIPE,
    text=True, env=env, cwd=cwd)``, forked from the zygote when that is the same (``module``:
    as for :func:`run`)."""
    cmd = [sys.executable, "-m", module, *args]
    where = os.fspath(cwd) if cwd is not None else os.getcwd()
    zygote = _get()
    if zygote is not None and zygote.fits(env, where):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            with open(os.devnull, "rb") as stdin:
                child = zygote.start(args, env, where, [stdin.fileno(), out_w, err_w], module)
        except ZygoteGone as exc:
            _give_up(str(exc))
            for fd in (out_r, err_r):
                os.close(fd)
        else:
            return Forked(cmd, child, out_r, err_r)
        finally:
            os.close(out_w)
            os.close(err_w)
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
    )
