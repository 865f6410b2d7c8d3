"""A scripted Messages API server: the model of the agent tests, a test host of their own.

Stdlib only; it runs as ``python3 model_server.py --port P --scenario S --log FILE`` in a
container the test starts (in the runner-cpu image), or on loopback. It answers
``POST /v1/messages`` as the Anthropic Messages API does, streamed (server-sent events:
``message_start`` ... ``message_stop``) or not, and ``HEAD`` (a client's warm-up). The
model's turns are scripted: the turn is the number of tool results in the request's
``messages``. Every request is logged as one JSON line (method, path, turn, usage sent), so a
test can count the model traffic.

Scenarios:

- ``evaluate``: run the toy evaluation with its stdout captured as evidence, write the
  preflight evidence and ``result.json``, then end the turn;
- ``runaway``: a Bash tool call every turn, for ever (a model that never stops);
- ``expensive``: like ``evaluate``, but each response reports a million output tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

EVALUATE = (
    "mkdir -p /job/output/logs && cd /job/workspace/repository && "
    "python3 evaluate.py --checkpoint checkpoint.json > /job/output/logs/evaluation.log"
)

RESULT = {
    "schemaVersion": "2.0",
    "status": "completed",
    "summary": "Evaluated the released checkpoint with evaluate.py.",
    "execution": {"status": "succeeded", "failure": None},
    "preflight": {
        "source": "agent",
        "evidencePath": "preflight.json",
        "checks": [
            {"id": "runtime", "status": "passed"},
            {"id": "checkpoint", "status": "passed"},
        ],
    },
    "evidence": [{"path": "logs/evaluation.log"}, {"path": "preflight.json"}],
    "experiment": {"commands": [EVALUATE]},
    "workloadCompletion": [
        {"groupId": "evaluation", "units": 1, "evidencePath": "logs/evaluation.log"}
    ],
    "diagnosis": "The evaluator ran once on the full label set; its stdout is the evidence.",
}

WRITE_RESULT = (
    "python3 -c 'import json,sys; "
    'json.dump({"runtime": "passed", "checkpoint": "passed"}, '
    'open("/job/output/preflight.json", "w")); '
    'open("/job/output/result.json", "w").write(sys.argv[1])\' '
    + "'"
    + json.dumps(RESULT).replace("'", "'\\''")
    + "'"
)

_lock = threading.Lock()


def _script(scenario: str, turn: int) -> tuple[str | None, str]:
    """The tool call of this turn (a Bash command, or None to end the turn) and the text."""
    if scenario == "runaway":
        return f"echo turn {turn}", f"Turn {turn}: one more look."
    steps = [EVALUATE, WRITE_RESULT]
    if turn < len(steps):
        return steps[turn], f"Step {turn + 1}."
    return None, "The evaluation ran and result.json is written."


def _turn(body: dict[str, Any]) -> int:
    count = 0
    for message in body.get("messages") or []:
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, list):
            count += sum(
                1
                for block in content
                if isinstance(block, dict) and block.get("type") == "tool_result"
            )
    return count


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "scripted-model/1"
    scenario = "evaluate"
    log_path = ""
    counter = 0

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write("model: " + (format % args) + "\n")

    def _log(self, entry: dict[str, Any]) -> None:
        with _lock:
            Handler.counter += 1
            entry = {"n": Handler.counter, **entry}
            if self.log_path:
                with open(self.log_path, "a") as f:
                    f.write(json.dumps(entry) + "\n")

    def do_HEAD(self) -> None:
        self._log({"method": "HEAD", "path": self.path})
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._log({"method": "GET", "path": self.path})
        self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": "no"}})

    def _json(self, code: int, value: dict[str, Any]) -> None:
        data = json.dumps(value).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if not self.path.startswith("/v1/messages") or self.path.startswith(
            "/v1/messages/count_tokens"
        ):
            self._log({"method": "POST", "path": self.path})
            self._json(
                404, {"type": "error", "error": {"type": "not_found_error", "message": "no"}}
            )
            return
        model = str(body.get("model") or "claude-sonnet-4-5")
        main = bool(body.get("tools"))  # a side request (a title, a summary) has no tools
        turn = _turn(body)
        command, text = _script(self.scenario, turn) if main else (None, "ok")
        output_tokens = 1_000_000 if self.scenario == "expensive" and main else 20
        usage = {"input_tokens": 100, "output_tokens": output_tokens}
        self._log(
            {
                "method": "POST",
                "path": self.path,
                "main": main,
                "turn": turn,
                "stream": bool(body.get("stream")),
                "model": model,
                "tool": command,
                "usage": usage,
                "apiKey": bool(self.headers.get("x-api-key")),
            }
        )
        mid = f"msg_scripted_{Handler.counter}"
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}]
        if command is not None:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_scripted_{Handler.counter}",
                    "name": "Bash",
                    "input": {"command": command, "description": text},
                }
            )
        stop = "tool_use" if command is not None else "end_turn"
        if not body.get("stream"):
            self._json(
                200,
                {
                    "id": mid,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": blocks,
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": usage,
                },
            )
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        start = {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 1},
        }
        events: list[tuple[str, dict[str, Any]]] = [("message_start", {"message": start})]
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                events += [
                    (
                        "content_block_start",
                        {"index": index, "content_block": {"type": "text", "text": ""}},
                    ),
                    (
                        "content_block_delta",
                        {"index": index, "delta": {"type": "text_delta", "text": block["text"]}},
                    ),
                ]
            else:
                opened = {**block, "input": {}}
                events += [
                    ("content_block_start", {"index": index, "content_block": opened}),
                    (
                        "content_block_delta",
                        {
                            "index": index,
                            "delta": {
                                "type": "input_json_delta",
                                "partial_json": json.dumps(block["input"]),
                            },
                        },
                    ),
                ]
            events.append(("content_block_stop", {"index": index}))
        events += [
            (
                "message_delta",
                {
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
            ),
            ("message_stop", {}),
        ]
        for name, data in events:
            payload = json.dumps({"type": name, **data})
            self.wfile.write(f"event: {name}\ndata: {payload}\n\n".encode())
        self.wfile.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="0.0.0.0")  # noqa: S104 - inside its container
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--scenario", default="evaluate", choices=["evaluate", "runaway", "expensive"]
    )
    parser.add_argument("--log", default="")
    args = parser.parse_args()
    Handler.scenario = args.scenario
    Handler.log_path = args.log
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    sys.stderr.write(f"model: serving {args.scenario} on {args.host}:{args.port}\n")
    server.serve_forever()


if __name__ == "__main__":
    main()
