"""The egress allowlist's test topology, shared by its tests and the benchmark: an "outside"
the caller makes itself. An internal network (no way out) with HTTP test hosts on it, each a
container of the job image reached by a name under ``.egress.test``; the host policy names
that network as the proxy's upstream. Every address a test talks to is one of these hosts
(or the job's own proxy): nothing leaves the machine, and nothing reaches the host itself.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner import backends
from runner.egress import slots as egress
from runner.testing.contracts import IMAGE
from runner.testing.engine import docker

__all__ = ["PORT", "SERVER", "SUBNET", "Outside", "left_behind", "outside"]

SERVER = r"""
import http.server, sys
role = sys.argv[1]
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if role.startswith("redirect="):
            self.send_response(302)
            self.send_header("Location", role.split("=", 1)[1])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if role.startswith("bytes="):
            size = int(role.split("=", 1)[1])
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            chunk = b"x" * (1 << 20)
            while size > 0:
                self.wfile.write(chunk[:size])
                size -= len(chunk)
            return
        body = f"hello from {role}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("", 8000), Handler)
print("ready", flush=True)
server.serve_forever()
"""
"""A test host: ``python3 -c SERVER ROLE`` serves port 8000 with ``hello from ROLE``, a 302
to the URL in ``redirect=URL``, or N bytes for ``bytes=N``."""

PORT = 8000

SUBNET = "{{(index .IPAM.Config 0).Subnet}}"
"""``docker network inspect --format`` of a network's (first) address range."""


@dataclass
class Outside:
    """The test's outside: its network and hosts (name -> address on that network)."""

    network: str
    labels: dict[str, str]
    subnet: str = ""
    """The network's address range: private, so the policy lets the proxy connect into it."""
    hosts: dict[str, str] = field(default_factory=dict)
    containers: list[str] = field(default_factory=list)

    def pair(self, name: str) -> str:
        return f"{name}:{PORT}"

    def policy(self, path: Path, allow: list[str], **more: Any) -> Path:
        """A host policy (unsigned contracts accepted) granting ``allow`` through this
        network, into whose private addresses the proxy may connect."""
        grant = {"allow": allow, "upstreamNetwork": self.network, "privateNetworks": [self.subnet]}
        data = {"acceptUnsigned": True, "egress": grant}
        path.write_text(json.dumps({**data, **more}))
        return path


def _check(ok: bool, why: str) -> None:
    """What the tests asserted, kept under ``python -O`` too."""
    if not ok:
        raise RuntimeError(why)


def _label_args(labels: dict[str, str]) -> list[str]:
    return [arg for k, v in labels.items() for arg in ("--label", f"{k}={v}")]


@contextmanager
def outside(
    labels: dict[str, str], roles: dict[str, str], runs: dict[str, str] | None = None
) -> Iterator[Outside]:
    """Make the outside: an internal network and one host per ``name: role`` (see
    :data:`SERVER`); everything is removed at the end, whatever happened, and so is whatever
    the runner left that carries the ``runs`` labels (its jobs' ``--label``s)."""
    tag = uuid.uuid4().hex[:10]
    net = Outside(f"egress-test-outside-{tag}", labels)
    try:
        made = docker("network", "create", "--internal", *_label_args(labels), net.network)
        _check(made.returncode == 0, made.stderr)
        net.subnet = docker("network", "inspect", "--format", SUBNET, net.network).stdout.strip()
        for name, role in roles.items():
            run = docker(
                "run", "-d", "--name", f"egress-test-{tag}-{name.split('.')[0]}",
                *_label_args(labels), "--network", net.network, "--network-alias", name,
                "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                "--memory", "512m", "--pids-limit", "64",
                IMAGE, "python3", "-c", SERVER, role,
            )  # fmt: skip
            _check(run.returncode == 0, run.stderr)
            cid = run.stdout.strip()
            net.containers.append(cid)
            fmt = f'{{{{(index .NetworkSettings.Networks "{net.network}").IPAddress}}}}'
            net.hosts[name] = docker("inspect", "--format", fmt, cid).stdout.strip()
        deadline = time.monotonic() + 60
        for cid in net.containers:
            while "ready" not in docker("logs", cid).stdout:
                _check(time.monotonic() < deadline, f"test host {cid[:12]} did not start")
                time.sleep(0.05)
        yield net
    finally:
        left = left_behind(runs) if runs else {"containers": [], "networks": []}
        if left["containers"] or net.containers:
            docker("rm", "-f", *left["containers"], *net.containers)
        if runs:  # the runs' free egress slots: their proxies are on this network
            egress.reap(backends.default(), idle_seconds=0.0, labels=runs)
        for name in [*left["networks"], net.network]:
            gone = docker("network", "rm", name)
            _check(gone.returncode == 0, gone.stderr)  # a slot still on it: never leave it


def left_behind(labels: dict[str, str]) -> dict[str, list[str]]:
    """The runner's containers and networks carrying ``labels`` (the run's own ``--label``s)
    that are still there."""
    filters = [f for k, v in {**labels, "org.runner.managed": "true"}.items()
               for f in ("--filter", f"label={k}={v}")]  # fmt: skip
    return {
        "containers": docker("ps", "-a", "--format", "{{.Names}}", *filters).stdout.split(),
        "networks": docker("network", "ls", "--format", "{{.Name}}", *filters).stdout.split(),
    }
