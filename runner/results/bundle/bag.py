"""What the checks of ``runner verify-bundle`` share: the report they fill (:class:`Problem`,
:class:`Check`, :class:`Report`), the keys an auditor trusts, the bag's file names, and
:class:`Bag`, one verification's state (the unpacked bag, what earlier checks found) with the
reading of a file of it under a cap. The checks themselves: :mod:`.fixity` (the archive and the
bag's manifests), :mod:`.signatures` (the seal, the contract's and the result's signatures),
:mod:`.verify` (their order, and the run's own record).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from runner.contract import VerifiedContract
from runner.core import safefs
from runner.core.errors import Category
from runner.models.envelope import ResultEnvelope
from runner.state import ledger
from runner.trust import signing

__all__ = [
    "CONTRACT",
    "ENVELOPE",
    "ENVELOPE_STATEMENT",
    "INPUT_MANIFEST",
    "LEDGER",
    "SIGNED_CONTRACT",
    "STATEMENT",
    "Bag",
    "Check",
    "Keys",
    "MiB",
    "Problem",
    "Report",
    "Status",
    "Stop",
]

MiB = 1024 * 1024
ENVELOPE = "data/result.json"
STATEMENT = "data/result.intoto.json"
ENVELOPE_STATEMENT = "data/result.envelope.intoto.json"
LEDGER = "data/record/ledger.jsonl"
CONTRACT = "data/input/task.json"
SIGNED_CONTRACT = "data/input/task.dsse.json"
INPUT_MANIFEST = "data/execution/input-manifest.json"

Status = Literal["ok", "failed", "unverified", "not run"]


@dataclass(frozen=True)
class Problem:
    file: str | None
    """Relative to the bag's folder (the archive's name for a problem of the archive)."""
    message: str
    category: Category = Category.BUNDLE_INVALID

    def __str__(self) -> str:
        return f"{self.file}: {self.message}" if self.file else self.message


@dataclass
class Check:
    name: str
    status: Status
    detail: str


@dataclass(frozen=True)
class Keys:
    """The keys the auditor trusts: runner keys (the seal, the result statement) and issuer
    keys (the contract)."""

    runner: list[signing.TrustedKey]
    issuer: list[signing.TrustedKey]


@dataclass
class Report:
    archive: str
    bag: str | None = None
    checks: list[Check] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    job_id: str | None = None
    status: str | None = None
    measurements: dict[str, Any] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    """What the export left out, and why (from runner-bundle.json)."""
    beside: list[str] = field(default_factory=list)
    """Payload files stored beside the archive that were checked in the blobs folder."""

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def category(self) -> Category | None:
        return self.problems[0].category if self.problems else None

    def as_json(self) -> dict[str, Any]:
        first = self.problems[0] if self.problems else None
        return {
            "valid": self.valid,
            "category": self.category.value if self.category else None,
            "archive": self.archive,
            "bag": self.bag,
            "jobId": self.job_id,
            "status": self.status,
            "firstProblem": {"file": first.file, "message": first.message} if first else None,
            "problems": [
                {"file": p.file, "message": p.message, "category": p.category.value}
                for p in self.problems
            ],
            "checks": [
                {"check": c.name, "status": c.status, "detail": c.detail} for c in self.checks
            ],
            "warnings": self.warnings,
            "measurements": self.measurements,
            "beside": self.beside,
            "skipped": self.skipped,
        }


class Stop(Exception):
    """Later checks cannot run on what is left."""


class Bag:
    """One verification: the bag unpacked at ``top``, what the checks found so far, and what
    every check reads with (a file under a cap, the envelope once loaded)."""

    def __init__(
        self, top: Path, blobs: Path, keys: Keys, allow_untrusted: bool, report: Report
    ) -> None:
        self.top = top
        self.blobs = blobs
        self.keys = keys
        self.allow_untrusted = allow_untrusted
        self.report = report
        self.info: dict[str, Any] = {}
        self.digests: dict[str, str] = {}
        """Payload file -> hex sha256, from the (verified) manifest."""
        self.beside: dict[str, Path] = {}
        """Payload file stored beside -> its checked blob."""
        self.absent: set[str] = set()
        self.envelope: ResultEnvelope | None = None
        self.envelope_raw = b""
        self.ledger_state: ledger.LedgerState | None = None
        self.contract: VerifiedContract | None = None

    def problem(
        self, file: str | None, message: str, category: Category = Category.BUNDLE_INVALID
    ) -> None:
        self.report.problems.append(Problem(file, message, category))

    def read(self, rel: str, cap: int) -> bytes | None:
        """A file of the bag (None when absent); over ``cap`` is a problem, and stops."""
        try:
            with safefs.open_under(self.top, rel) as f:
                data = f.read(cap + 1)
        except safefs.UnsafePath as exc:
            if exc.missing:
                return None
            self.problem(rel, exc.problem)
            raise Stop from None
        if len(data) > cap:
            self.problem(rel, f"is over {cap:,} bytes, more than such a file ever holds")
            raise Stop
        return data

    def loaded(self) -> ResultEnvelope:
        """The bundled envelope (the checks that need it run only once it is read)."""
        if self.envelope is None:
            raise Stop
        return self.envelope

    def clean(self, text: str) -> str:
        """bagit.py's messages, without this run's temporary folder."""
        return text.replace(f"{self.top}{os.sep}", "").replace(str(self.top), ".")

    def payload_path(self, output_rel: str) -> str:
        """``data/output/<path>`` for a path under output/ ('' when it leaves output/)."""
        try:
            return "/".join(["data", "output", *safefs.parts(output_rel)])
        except safefs.UnsafePath:
            return ""

    def why(self, rel: str) -> str:
        for s in self.report.skipped:
            if f"data/{s['path']}" == rel:
                return f" (left out at export: it {s['why']})"
        return ""
