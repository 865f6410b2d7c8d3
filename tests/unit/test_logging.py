"""The runner's log: off by default, text or JSON lines on stderr when asked (issue 18).

The tests that need the engine are in tests/integration/test_logging.py."""

from __future__ import annotations

from tests.support import run_cli


def test_a_bad_log_option_is_a_usage_error() -> None:
    proc = run_cli("--log-level", "loud", "parsers")
    assert proc.returncode == 2 and "--log-level wants one of" in proc.stderr
    proc = run_cli("parsers", "--log-format=xml")
    assert proc.returncode == 2 and "--log-format wants one of" in proc.stderr
    assert run_cli("--log-level=debug", "parsers").returncode == 0
