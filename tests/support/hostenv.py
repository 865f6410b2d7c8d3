"""The runner's own environment variables: the ``RUNNER_*`` names it reads from the host's
environment (``runner/app/host.py``, ``runner/cli``, ``runner/backends``). The test session
clears exactly these, so a developer's settings never reach a test, while a CI service's own
``RUNNER_*`` variables (``RUNNER_TEMP``, ``RUNNER_OS``, ...) stay. ``tests/test_hostenv.py``
fails when the runner reads one that is not listed here.

The variables the runner sets inside a job (``RUNNER_JOB_ID``, ``RUNNER_STDOUT``, ...) are
not read from the host and are not listed."""

from __future__ import annotations

HOST_VARIABLES = (
    "RUNNER_ALLOW_NETWORK",
    "RUNNER_ALLOW_UNPINNED_IMAGES",
    "RUNNER_ALLOW_UNSIGNED",
    "RUNNER_CDI_DIRS",
    "RUNNER_CONFIG_DIR",
    "RUNNER_ENGINE",
    "RUNNER_GPU_LOCK_DIR",
    "RUNNER_LOG_FORMAT",
    "RUNNER_LOG_LEVEL",
    "RUNNER_POLICY",
    "RUNNER_SERVER",
    "RUNNER_STATE_DIR",
    "RUNNER_TRUSTED_KEYS",
)
