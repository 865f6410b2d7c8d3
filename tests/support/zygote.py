"""The fork server behind :func:`tests.support.cli.run`: run as a script (``python
tests/support/zygote.py FD``) by the test process, it imports the runner's command line and every
command's module once, then forks one child per request, which runs ``python -m runner`` as a
fresh interpreter would: its own environment, working directory, standard streams, ``sys.argv``
and ``sys.path[0]``, the runner's real entry point (``runner/__main__.py``), and the
interpreter's own ending (non-daemon threads joined, atexit handlers, streams flushed, an
uncaught exception's traceback and exit 1, an uncaught Ctrl-C's death by SIGINT).

Only the standard library and ``runner`` are imported here (never pytest or the tests), so that a
child holds nothing a fresh ``python -m runner`` would not. The protocol, on the
``SOCK_SEQPACKET`` socket FD: the zygote sends ``{"ready": ...}`` once warm; each request is a
message ``r`` with four descriptors (a stream socket for this request, stdin, stdout, stderr);
the zygote reads the request (one JSON line: argv, env, cwd, umask, and the module, ``runner``
unless given) from that socket, forks, answers ``{"pid": N}`` and, once the child is reaped,
``{"exit": CODE}`` (a negative CODE: killed by that signal). An empty message (the test process
is gone) ends the zygote.
"""

from __future__ import annotations

import os
import sys

sys.path[0] = os.getcwd()  # as `python -m` has it (not tests/support, this script's folder)

import contextlib  # noqa: E402
import gc  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import selectors  # noqa: E402
import signal  # noqa: E402
import site  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
from typing import Any  # noqa: E402

MAX_REQUEST = 16 << 20


def warm() -> None:
    """Import what a command imports (as ``runner serve`` does), without asking the engine
    anything: a command's answer must not depend on what the zygote saw at its start."""
    # As runner.cli.dispatch does before it imports a command's module (the test process
    # checks that a request's environment agrees, else it runs a fresh interpreter).
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    import runpy  # noqa: F401

    import ijson  # type: ignore[import-untyped]  # noqa: F401
    import platformdirs  # noqa: F401

    import runner.client  # noqa: F401
    from runner import backends  # noqa: F401
    from runner.app import batch  # noqa: F401
    from runner.cli import load_all
    from runner.contract import load  # noqa: F401
    from runner.evidence import read as evidence  # noqa: F401
    from runner.execution import orchestrator, sweeper  # noqa: F401
    from runner.planning import plan, policy  # noqa: F401
    from runner.results import attest  # noqa: F401

    load_all()
    gc.freeze()  # the children share these pages rather than copying them at their first GC


def found_elsewhere() -> str | None:
    """Where a fresh ``python -m runner`` started in a folder without a ``runner`` of its own
    would import ``runner`` from (the path after ``sys.path[0]``, and any other finder, such as
    an editable install's)."""
    saved = sys.path[:]
    try:
        sys.path[:] = saved[1:]
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find("runner", None) if find is not None else None
            if spec is not None:
                return str(spec.origin)
        return None
    finally:
        sys.path[:] = saved


def recv_line(conn: socket.socket) -> Any:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk or len(data) > MAX_REQUEST:
            raise EOFError("the request ended early")
        data += chunk
    return json.loads(data)


def std_stream(fd: int, like: io.TextIOWrapper, write: bool) -> io.TextIOWrapper:
    """A standard stream for ``fd`` as the interpreter makes it at its start (create_stdio):
    buffered, ``\\n`` newlines, line-buffered on a terminal (stderr always), the zygote's
    encoding and errors (its environment's locale and PYTHONIOENCODING, the request's too)."""
    unbuffered = like.write_through  # -u or PYTHONUNBUFFERED, the request's too
    mode, buffering = ("wb" if write else "rb"), (0 if unbuffered else -1)
    raw = open(fd, mode, buffering=buffering, closefd=False)  # noqa: SIM115 - the stream's
    stream = io.TextIOWrapper(
        raw,  # type: ignore[arg-type]
        encoding=like.encoding,
        errors=like.errors,
        newline="\n",
        line_buffering=not unbuffered and (fd == 2 or os.isatty(fd)),
        write_through=unbuffered,
    )
    stream.mode = "w" if write else "r"  # type: ignore[misc]
    return stream


def exit_code(exc: SystemExit) -> int:
    """The interpreter's exit status for an uncaught SystemExit (Py_HandleSystemExit)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):  # as the interpreter, which ignores it too
        print(code, file=sys.stderr)
    return 1


def report(exc: BaseException) -> None:
    """An uncaught exception's traceback, as the interpreter prints it: from runpy's frames on
    (this module's own frame left out)."""
    if exc.__traceback__ is not None:
        exc.__traceback__ = exc.__traceback__.tb_next
    sys.excepthook(type(exc), exc, exc.__traceback__)


def child(request: dict[str, Any], stdio: list[int]) -> None:
    """In the fork: become ``python -m runner`` with the request's argv, env and cwd; never
    returns."""
    code = 1
    killed_by: int | None = None
    try:
        # The zygote ignores SIGINT and forks with it blocked: one sent before the module runs
        # is pending, not lost, and taken (unblocked) where the module's would be.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # a fresh process has only 0, 1 and 2
        os.chdir(request["cwd"])
        os.umask(int(request.get("umask", 0o022)))
        os.environ.clear()
        os.environ.update(request["env"])
        time.tzset()  # TZ as the fresh process would read it
        sys.path[0] = os.getcwd()
        sys.stdin = sys.__stdin__ = std_stream(0, sys.__stdin__, write=False)  # type: ignore[arg-type]
        sys.stdout = sys.__stdout__ = std_stream(1, sys.__stdout__, write=True)  # type: ignore[arg-type]
        sys.stderr = sys.__stderr__ = std_stream(2, sys.__stderr__, write=True)  # type: ignore[arg-type]
        sys.argv = ["-m", *request["argv"]]  # runpy sets argv[0] to runner/__main__.py
        sys.modules["__main__"] = types.ModuleType("__main__")
        tempfile.tempdir = None  # gettempdir() reads the request's TMPDIR, not a stale answer
        import runpy

        try:
            module = request.get("module", "runner")
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined]
            code = 0
        except SystemExit as exc:
            code = exit_code(exc)
        except KeyboardInterrupt as exc:
            report(exc)
            killed_by = signal.SIGINT  # the interpreter ends by the signal since 3.8
        except BaseException as exc:  # noqa: BLE001 - the interpreter's own report: traceback, 1
            report(exc)
            code = 1
        import threading

        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()  # join non-daemon threads, as Py_FinalizeEx does first
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a reader gone: the interpreter exits 120
                if stream is sys.stdout:
                    code = 120
    except BaseException as exc:  # noqa: BLE001 - the zygote's own failure, said plainly
        try:
            os.write(2, f"tests/support/zygote.py: the fork failed: {exc!r}\n".encode())
        finally:
            os._exit(1)
    if killed_by is not None:
        signal.signal(killed_by, signal.SIG_DFL)
        os.kill(os.getpid(), killed_by)
    os._exit(code)


def main() -> None:
    ctl = socket.socket(fileno=int(sys.argv[1]))
    # Ctrl-C in the terminal is pytest's to handle; the zygote ends when its socket closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warm()
    import runner

    ready = {
        "ready": True,
        "userSite": bool(site.ENABLE_USER_SITE),
        "runner": runner.__file__,
        "runnerElsewhere": found_elsewhere(),
    }
    ctl.send(json.dumps(ready).encode())
    selector = selectors.DefaultSelector()
    selector.register(ctl, selectors.EVENT_READ, None)
    while True:
        for key, _ in selector.select():
            if key.data is not None:
                pid, reply = key.data
                _, status = os.waitpid(pid, 0)
                selector.unregister(key.fd)
                os.close(key.fd)
                with contextlib.suppress(OSError):  # else the caller is gone
                    reply.sendall(
                        json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n"
                    )
                reply.close()
                continue
            msg, fds, _, _ = socket.recv_fds(ctl, 16, 4)
            if not msg:
                return  # the test process is gone
            if len(fds) != 4:
                for fd in fds:
                    os.close(fd)
                continue
            reply = socket.socket(fileno=fds[0])
            stdio = fds[1:]
            try:
                request = recv_line(reply)
            except (OSError, EOFError, ValueError):
                reply.close()
                for fd in stdio:
                    os.close(fd)
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            # SIGINT blocked across the fork: the test may signal the pid as soon as it has it,
            # before the child sets its handler (an ignored signal would be dropped).
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            pid = os.fork()
            if pid == 0:
                child(request, stdio)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            for fd in stdio:
                os.close(fd)
            with contextlib.suppress(OSError):
                reply.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            selector.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, reply))


if __name__ == "__main__":
    main()
