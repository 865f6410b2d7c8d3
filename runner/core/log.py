"""The runner's log: the standard library's ``logging``, quiet by default.

Off unless asked: ``runner --log-level info`` (or ``$RUNNER_LOG_LEVEL``) turns it on, on stderr;
``--log-format json`` (``$RUNNER_LOG_FORMAT``) writes one JSON object per line for a log
pipeline: ``ts``, ``level``, ``event``, and the run's ``jobId``, ``stage``, ``attempt``,
``category`` where they are known. The runner logs what it does, never a job's environment,
a key or a credential.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

__all__ = ["FORMATS", "LEVELS", "LOGGER", "configure", "event"]

LOGGER = logging.getLogger("runner")
LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
FIELDS = ("jobId", "stage", "attempt", "category", "seconds", "detail")


def event(level: int, message: str, **fields: Any) -> None:
    """Log ``message`` with the run's fields (None ones are left out)."""
    if LOGGER.isEnabledFor(level):
        LOGGER.log(
            level, message, extra={"runner": {k: v for k, v in fields.items() if v is not None}}
        )


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            **getattr(record, "runner", {}),
        }
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """``runner: info: event (jobId=... stage=...)``."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "runner", {})
        said = " ".join(f"{k}={v}" for k, v in fields.items())
        return f"runner: {record.levelname.lower()}: {record.getMessage()}" + (
            f" ({said})" if said else ""
        )


def configure(level: str | None, fmt: str | None) -> None:
    """Send the runner's log to stderr from ``level`` on, in ``fmt``; no level: no log at all
    (the CLI's own output says what a person needs)."""
    LOGGER.handlers.clear()
    LOGGER.propagate = False
    if level is None:
        LOGGER.setLevel(logging.CRITICAL + 1)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    LOGGER.addHandler(handler)
    LOGGER.setLevel(level.upper())
