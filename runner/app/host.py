"""What this host is set up with: its folders, its operator's ``RUNNER_*`` switches, its
policy and trusted keys, the server socket, and how a runner process takes SIGINT and SIGTERM.

Shared by the CLI, the client, the server and the batch without importing any of them. It is
on the path of every ``runner`` start-up, so it imports only ``os`` and ``sys`` when loaded;
whatever else a function needs (pathlib, platformdirs, the policy and its pydantic models) is
imported when that function is called.

=========================  =========================================================
setting                    where it comes from
=========================  =========================================================
config dir                 ``$RUNNER_CONFIG_DIR``, else the user's (``~/.config/runner``)
state dir                  ``--state-dir``, else ``$RUNNER_STATE_DIR``, else the user's
trusted issuer keys        ``--trusted-keys``, else ``$RUNNER_TRUSTED_KEYS``, else
                           ``<config>/trusted-keys``
trusted runner keys        ``--key``/``--result-keys`` (verify-result, verify-bundle),
                           else this host's runner key and
                           ``<config>/trusted-runner-keys``
host policy                ``--policy``, else ``$RUNNER_POLICY``, else
                           ``<config>/policy.json`` when it exists, else the defaults
the runner's result key    the policy's ``resultSigningKey``, else
                           ``<config>/runner-key/runner.key``
GPU device locks           ``$RUNNER_GPU_LOCK_DIR``, else ``/run/lock/runner-gpus`` (one
                           folder per host, mode 1777, shared by every user's runner)
CDI spec folders           ``$RUNNER_CDI_DIRS`` (folders separated by ``:``), else
                           ``/etc/cdi`` and ``/var/run/cdi``
operator switches          ``RUNNER_ALLOW_NETWORK``, ``RUNNER_ALLOW_UNSIGNED``,
                           ``RUNNER_ALLOW_UNPINNED_IMAGES`` (or their flags)
server socket              ``$RUNNER_SERVER`` (``off`` switches serving off), else
                           ``<config>/server.sock``
a server started on demand ``$RUNNER_AUTOSERVE`` (a duration: its idle time; unset, ``0`` or
                           ``off``: none)
=========================  =========================================================
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    import _socket
    from pathlib import Path
    from types import FrameType

    from runner.contract import Trust
    from runner.planning.policy import LoadedPolicy

__all__ = [
    "IDLE_EXIT_MAX_SECONDS",
    "SERVED",
    "cdi_dirs",
    "code_fingerprint",
    "config_dir",
    "gpu_lock_dir",
    "install_signal_handlers",
    "load",
    "open_server_lock",
    "peer",
    "policy_path",
    "result_key_path",
    "served",
    "server_lock",
    "socket_path",
    "split_logging_options",
    "state_dir",
    "trusted_keys_dir",
    "trusted_runner_keys_dir",
]


def gpu_lock_dir() -> Path | None:
    """``$RUNNER_GPU_LOCK_DIR``, else None: the host-wide default (``/run/lock/runner-gpus``)."""
    from pathlib import Path  # not at start-up (see the module's docstring)

    given = os.environ.get("RUNNER_GPU_LOCK_DIR")
    return Path(given) if given else None


def cdi_dirs() -> tuple[Path, ...] | None:
    """``$RUNNER_CDI_DIRS`` (``:``-separated, lowest priority first), else None: the CDI
    defaults (``/etc/cdi``, ``/var/run/cdi``)."""
    from pathlib import Path

    given = [d for d in os.environ.get("RUNNER_CDI_DIRS", "").split(":") if d]
    return tuple(Path(d) for d in given) or None


def env_flag(name: str) -> bool:
    """An operator switch in the environment: ``1``, ``true``, ``yes`` or ``on``."""
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def config_dir() -> str:
    """The runner's config folder: ``$RUNNER_CONFIG_DIR``, else the user's (XDG on Linux).

    A str, not a Path: the client asks for it on every served start-up, before pathlib."""
    configured = os.environ.get("RUNNER_CONFIG_DIR")
    if configured:
        return configured
    import platformdirs

    return str(platformdirs.user_config_dir("runner"))


def state_dir(given: str | None = None) -> Path:
    """Where job folders live: ``given`` (--state-dir), else ``$RUNNER_STATE_DIR``, else the
    user's state dir; made absolute (a job's mounts are named from it, and the engine takes
    only absolute paths; no link in it is resolved)."""
    from pathlib import Path

    if given:
        return Path(given).absolute()
    if os.environ.get("RUNNER_STATE_DIR"):
        return Path(os.environ["RUNNER_STATE_DIR"]).absolute()
    import platformdirs

    return Path(platformdirs.user_state_dir("runner"))


def trusted_keys_dir(given: str | None = None) -> Path:
    """The trusted issuer keys: ``given`` (--trusted-keys), else ``$RUNNER_TRUSTED_KEYS``,
    else ``<config dir>/trusted-keys``."""
    from pathlib import Path

    if given:
        return Path(given)
    if os.environ.get("RUNNER_TRUSTED_KEYS"):
        return Path(os.environ["RUNNER_TRUSTED_KEYS"])
    return Path(config_dir()) / "trusted-keys"


def trusted_runner_keys_dir(given: str | None = None) -> Path:
    """The trusted runner keys (for signed results): ``given`` (--result-keys), else
    ``<config dir>/trusted-runner-keys``."""
    from pathlib import Path

    return Path(given) if given else Path(config_dir()) / "trusted-runner-keys"


def policy_path(given: str | None = None) -> Path | None:
    """The host policy file: ``given`` (--policy), else ``$RUNNER_POLICY``, else
    ``<config dir>/policy.json`` when it exists; None: the defaults."""
    from pathlib import Path

    if given:
        return Path(given)
    if os.environ.get("RUNNER_POLICY"):
        return Path(os.environ["RUNNER_POLICY"])
    default = Path(config_dir()) / "policy.json"
    return default if default.exists() else None


def result_key_path(configured: str | None = None) -> Path:
    """The runner's own signing key: ``configured`` (the policy's ``resultSigningKey``), else
    ``<config dir>/runner-key/runner.key`` (made on first use, by attest.runner_key)."""
    from pathlib import Path

    if configured:
        return Path(configured)
    return Path(config_dir()) / "runner-key" / "runner.key"


def load(
    policy: str | None = None,
    trusted_keys: str | None = None,
    *,
    allow_network: bool = False,
    allow_unsigned: bool = False,
    allow_unpinned_image: bool = False,
) -> tuple[LoadedPolicy, Trust]:
    """The host's policy (its file, then the operator's switches, given or from the
    environment) and its trusted keys. Raises HostConfigError for a broken policy file."""
    from runner.contract import Trust
    from runner.planning import policy as host_policy

    loaded = host_policy.with_switches(
        host_policy.load(policy_path(policy)),
        network=allow_network or env_flag("RUNNER_ALLOW_NETWORK"),
        unsigned=allow_unsigned or env_flag("RUNNER_ALLOW_UNSIGNED"),
        unpinned=allow_unpinned_image or env_flag("RUNNER_ALLOW_UNPINNED_IMAGES"),
    )
    folder = trusted_keys_dir(trusted_keys)
    return loaded, Trust(folder=folder, threshold=loaded.policy.signatureThreshold)


LOGGING_OPTIONS = ("--log-level", "--log-format")
"""The options every command takes anywhere before ``--`` (``--log-level X`` or ``=X``)."""


def split_logging_options(given: list[str]) -> tuple[dict[str, str | None], list[str]]:
    """The :data:`LOGGING_OPTIONS` ``given`` names before ``--`` (each named one's value, the
    last given; None when nothing follows it) and the rest of the command line, as the CLI
    reads it."""
    chosen: dict[str, str | None] = {}
    rest: list[str] = []
    it = iter(given)
    for arg in it:
        if arg == "--":
            rest.append(arg)
            rest.extend(it)
            break
        name, eq, value = arg.partition("=")
        if name in LOGGING_OPTIONS:
            chosen[name] = value if eq else next(it, None)
        else:
            rest.append(arg)
    return chosen, rest


SERVED = frozenset({"run", "verify"})
"""The first words of the commands a server runs: ``run`` and ``verify contract`` (also
spelled ``verify CONTRACT``); the others start fast on their own."""

NOT_SERVED = frozenset({"result", "bundle", "ledger", "-h", "--help"})
"""What may follow ``verify`` that makes it other than ``verify contract``."""


def served(given: list[str]) -> bool:
    """Whether the command line ``given`` is ``runner run`` or ``runner verify contract`` as
    the CLI reads it (the logging options, wherever they are, dropped first): the commands a
    client hands to a server, and the only ones a server runs for its clients."""
    _, rest = split_logging_options(given)
    if not rest or rest[0] not in SERVED:
        return False
    return rest[0] == "run" or len(rest) == 1 or rest[1] not in NOT_SERVED


def socket_path() -> str | None:
    """Where the server listens (``$RUNNER_SERVER``, else ``<config dir>/server.sock``), or
    None when serving is switched off."""
    configured = os.environ.get("RUNNER_SERVER", "")
    if configured.lower() in {"off", "0", "no", "false"}:
        return None
    if configured:
        return configured
    return os.path.join(config_dir(), "server.sock")


def peer(conn: _socket.socket) -> tuple[int, int]:
    """The pid and uid of the process at the other end of the Unix socket ``conn``
    (SO_PEERCRED): the server checks its client's, the client its server's. ``conn`` may be
    a ``socket.socket`` or the ``_socket.socket`` under it (the client's, runner.client)."""
    import _socket as sockets
    import _struct  # not struct: the client imports nothing it can do without

    raw = conn.getsockopt(sockets.SOL_SOCKET, sockets.SO_PEERCRED, _struct.calcsize("iII"))
    pid, uid, _gid = _struct.unpack("iII", raw)  # uid_t and gid_t are unsigned
    return int(pid), int(uid)


IDLE_EXIT_MAX_SECONDS = 7 * 86400
"""The longest idle time a server may be given (``runner serve --idle-exit``, and
``RUNNER_AUTOSERVE`` for the one a client starts)."""


def server_lock(path: str) -> str:
    """The lock a server at socket ``path`` holds while it lives (``<socket>.lock``): one
    server a socket (runner.app.server), and a client that starts one takes it first."""
    return path + ".lock"


def open_server_lock(path: str) -> int:
    """:func:`server_lock` of the socket ``path`` opened (not taken): made this user's own and
    private; a link there replaced (runner.core.locks.open_private_lock_file). One of another
    user (a socket in a shared folder, where anyone could hold it to keep every server away):
    OSError saying so."""
    from pathlib import Path

    from runner.core import locks

    fd = locks.open_private_lock_file(Path(server_lock(path)))
    owner = os.fstat(fd).st_uid
    if owner != os.geteuid():
        os.close(fd)
        raise PermissionError(f"{server_lock(path)} belongs to uid {owner}, not to this user")
    return fd


def code_fingerprint() -> str:
    """What the running code is: the interpreter, and the runner's source files (count and
    newest modification). A client and a server agree only when both run the same code."""
    newest, count = 0, 0
    for folder, _, files in os.walk(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))):
        for name in files:
            if name.endswith(".py"):
                newest = max(newest, os.stat(os.path.join(folder, name)).st_mtime_ns)
                count += 1
    return f"{sys.executable}|{count}|{newest}"


def install_signal_handlers() -> None:
    """SIGTERM behaves as Ctrl-C: the first stops the job cleanly; later ones are ignored so
    the clean-up is not cut short. The KeyboardInterrupt waits for the end of a write that
    must not be cut in two (runner.core.interrupts: a ledger append)."""
    import signal

    from runner.core import interrupts

    fired = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        interrupts.interrupt()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
