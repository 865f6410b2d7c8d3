"""`runner report`: one self-contained HTML page of a run, from its job folder or its bundle.

:mod:`.gather` reads what the page shows as plain data (:class:`~.gather.ReportData`): the
envelope, an excerpt of each measurement's evidence (:mod:`.excerpt`, read as hostile bytes),
the attempts, and whether the signatures verify, by the checks `runner verify result` and
`runner verify bundle` run. :mod:`.page` renders it, one function a section. :func:`write`
puts the page in a file.
"""

from __future__ import annotations

from pathlib import Path

from runner.results.report.gather import ReportData, from_bundle, from_job
from runner.results.report.page import render

__all__ = ["ReportData", "from_bundle", "from_job", "render", "write"]


def write(data: ReportData, path: Path) -> Path:
    """The page of ``data`` written to ``path`` (replaced atomically); returns ``path``."""
    from runner.state.jobdir import atomic_write

    atomic_write(path, render(data).encode())
    return path
