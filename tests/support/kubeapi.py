"""A stand-in for a Kubernetes API server, for tests of runner/scheduling/kubernetes/apply.py:
a small HTTP server on 127.0.0.1 that speaks just enough of the API for the official Python
client to create, read and dry-run Jobs and NetworkPolicies, list a Job's pods (by label
selector), and records every request it is sent.

It is not a cluster and checks nothing a real API server checks (no schema, no admission, no
scheduling): it stores what it is sent, answers 409 for a name taken, 404 for a name not
there, stores nothing for ``dryRun=All``, and answers 401 to a request without its bearer
token. A test sets a stored Job's status (its conditions) itself, and adds the Job's pod with
the status (its times) it wants read (:meth:`ApiServer.add_pod`); deleting a Job deletes its
pods, as Foreground propagation does.
"""

from __future__ import annotations

import copy
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

COLLECTIONS = {
    ("apis/batch/v1", "jobs"): "Job",
    ("apis/networking.k8s.io/v1", "networkpolicies"): "NetworkPolicy",
    ("api/v1", "pods"): "Pod",
}
CONTROLLER_UID = "batch.kubernetes.io/controller-uid"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    authorization: str | None
    body: Any

    @property
    def collection(self) -> str:
        """``jobs`` or ``networkpolicies`` (the plural after the namespace)."""
        parts = self.path.strip("/").split("/")
        return parts[parts.index("namespaces") + 2] if "namespaces" in parts else ""


@dataclass
class ApiServer:
    """What the stand-in holds: objects by (kind, namespace, name), and every request."""

    token: str
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    fail_with: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    """(method, kind) -> (status, message): answer such requests with that error."""
    hide_once: set[str] = field(default_factory=set)
    """Kinds whose next GET answers 404 even when the object is there (it was made between
    that read and the create that follows, by another submitter)."""
    answer_with: dict[tuple[str, str], Any] = field(default_factory=dict)
    """(method, kind) -> any JSON value, answered with 200 as it is (a hostile server)."""
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
        """Store ``obj`` as if created earlier (a test's pre-existing object)."""
        stored = copy.deepcopy(obj)
        stored["metadata"] = {**stored["metadata"], "namespace": namespace,
                              "uid": str(uuid.uuid4())}  # fmt: skip
        with self.lock:
            self.objects[(obj["kind"], namespace, obj["metadata"]["name"])] = stored
        return stored

    def set_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        with self.lock:
            self.objects[("Job", namespace, name)]["status"] = status

    def add_pod(
        self, namespace: str, job_name: str, status: dict[str, Any], *, owner: str | None = None
    ) -> dict[str, Any]:
        """A pod of the stored Job ``job_name`` (labelled and owned by its uid, or by
        ``owner``'s uid) with ``status`` as the kubelet would report it."""
        with self.lock:
            uid = owner or self.objects[("Job", namespace, job_name)]["metadata"]["uid"]
            name = f"{job_name}-{uuid.uuid4().hex[:5]}"
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                    "labels": {CONTROLLER_UID: uid, "job-name": job_name},
                    "ownerReferences": [{"kind": "Job", "name": job_name, "uid": uid}],
                },
                "status": status,
            }  # fmt: skip
            self.objects[("Pod", namespace, name)] = pod
            return pod

    def writes(self) -> list[Request]:
        return [r for r in self.requests if r.method != "GET"]


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": reason, "message": message}  # fmt: skip


def _handler(server: ApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def _answer(self, code: int, data: Any) -> None:
            raw = json.dumps(data).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _route(self) -> tuple[str, str, str | None] | None:
            """(kind, namespace, name or None) of /<group path>/namespaces/NS/<plural>[/NAME]."""
            parts = urlsplit(self.path).path.strip("/").split("/")
            if "namespaces" not in parts:
                return None
            i = parts.index("namespaces")
            group, rest = "/".join(parts[:i]), parts[i + 1 :]
            if len(rest) not in (2, 3):
                return None
            kind = COLLECTIONS.get((group, rest[1]))
            if kind is None:
                return None
            return kind, rest[0], rest[2] if len(rest) == 3 else None

        def _handle(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            split = urlsplit(self.path)
            request = Request(method, split.path, parse_qs(split.query),
                              self.headers.get("Authorization"), body)  # fmt: skip
            with server.lock:
                server.requests.append(request)
            if request.authorization != f"Bearer {server.token}":
                self._answer(401, _status(401, "Unauthorized", "Unauthorized"))
                return
            route = self._route()
            if route is None:
                self._answer(404, _status(404, "NotFound", f"no route {split.path}"))
                return
            kind, namespace, name = route
            if (method, kind) in server.fail_with:
                code, message = server.fail_with[(method, kind)]
                self._answer(code, _status(code, "Invalid", message))
                return
            if (method, kind) in server.answer_with:
                self._answer(200, server.answer_with[(method, kind)])
                return
            if method == "GET" and name is None and kind == "Pod":
                wanted = request.query.get("labelSelector", [""])[0]
                key, _, value = wanted.partition("=")
                with server.lock:
                    items = [
                        copy.deepcopy(o) for (k, ns, _), o in server.objects.items()
                        if k == "Pod" and ns == namespace
                        and (not key or o["metadata"]["labels"].get(key) == value)
                    ]  # fmt: skip
                self._answer(200, {"kind": "PodList", "apiVersion": "v1", "items": items})
                return
            if method == "GET" and name is not None:
                with server.lock:
                    found = server.objects.get((kind, namespace, name))
                    if kind in server.hide_once:
                        server.hide_once.discard(kind)
                        found = None
                if found is None:
                    self._answer(404, _status(404, "NotFound", f'{kind} "{name}" not found'))
                else:
                    self._answer(200, found)
                return
            if method == "POST" and name is None and isinstance(body, dict):
                name = str(body["metadata"]["name"])
                with server.lock:
                    if (kind, namespace, name) in server.objects:
                        self._answer(409, _status(409, "AlreadyExists", f'"{name}" exists'))
                        return
                    made = copy.deepcopy(body)
                    made["metadata"]["uid"] = str(uuid.uuid4())
                    if kind == "Job":
                        made["status"] = {}
                    if request.query.get("dryRun") != ["All"]:
                        server.objects[(kind, namespace, name)] = made
                self._answer(201, made)
                return
            if method == "DELETE" and name is not None:
                with server.lock:
                    gone = server.objects.pop((kind, namespace, name), None)
                    if gone is not None and kind == "Job":  # its pods with it (Foreground)
                        uid = gone["metadata"]["uid"]
                        for key in [
                            k
                            for k, o in server.objects.items()
                            if k[0] == "Pod" and o["metadata"]["labels"].get(CONTROLLER_UID) == uid
                        ]:
                            del server.objects[key]
                if gone is None:
                    self._answer(404, _status(404, "NotFound", f'{kind} "{name}" not found'))
                else:
                    self._answer(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
                return
            self._answer(405, _status(405, "MethodNotAllowed", method))

        def do_DELETE(self) -> None:
            self._handle("DELETE")

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

    return Handler


@contextmanager
def api_server(token: str | None = None) -> Iterator[ApiServer]:
    """A stand-in API server on 127.0.0.1 (a free port), stopped at the end."""
    state = ApiServer(token=token or uuid.uuid4().hex)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def write_kubeconfig(path: Path, contexts: dict[str, ApiServer], current: str) -> Path:
    """A kubeconfig with one cluster, user (its bearer token) and context per server."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": current,
        "clusters": [{"name": n, "cluster": {"server": s.url}} for n, s in contexts.items()],
        "users": [{"name": n, "user": {"token": s.token}} for n, s in contexts.items()],
        "contexts": [{"name": n, "context": {"cluster": n, "user": n}} for n in contexts],
    }
    path.write_text(json.dumps(config))
    return path
