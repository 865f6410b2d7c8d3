"""The runner's own environment variables: the ``RUNNER_*`` names it reads from the host's
environment, as ``runner/core/envvars.py`` (their one owner, which the documentation's
reference page is generated from) declares them. The test session clears exactly these, so a
developer's settings never reach a test, while a CI service's own ``RUNNER_*`` variables
(``RUNNER_TEMP``, ``RUNNER_OS``, ...) stay. ``tests/unit/test_hostenv.py`` fails when the runner
reads one that is not declared.

The variables the runner sets inside a job (``RUNNER_JOB_ID``, ``RUNNER_STDOUT``, ...) are
not read from the host and are not listed."""

from __future__ import annotations

from runner.core import envvars

HOST_VARIABLES = tuple(sorted(v.name for v in envvars.READ if v.name.startswith("RUNNER_")))
