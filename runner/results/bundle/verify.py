"""``runner verify-bundle ARCHIVE``: check a bundle of one run, offline, with no engine.

The checks, in this order; each problem names its file, relative to the bag's folder:

1. *archive*: a tar of one top folder holding only files and folders (no link, device or
   FIFO, no name twice, no ``..``, names as :func:`runner.core.archives.member_parts` allows),
   within the caps. A first pass reads only headers and writes nothing: each member's
   declared size is checked against the caps and the bag's Payload-Oxum (from bag-info.txt)
   as its header is read, and the whole against the temporary folder's free space; the
   stream decompressed is capped (:func:`runner.core.archives.open_tar`). Only then is it
   unpacked, by :class:`runner.core.archives.Writer` (no tarfile extraction filter is relied on),
   into a fresh temporary folder (removed afterwards);
2. *seal*: ``bundle.intoto.json`` verifies against a trusted runner key and signs the
   tag manifest's digest;
3. *tag files*: each file the tag manifest lists hashes to it; no other file outside
   ``data/``;
4. *payload*: bagit.py validates the bag (completeness, every sha256); each file stored
   beside it (``fetch.txt``) is checked in the blobs folder: there, a regular file, of the
   listed size and digest;
5. *ledger*: its hash chain, order and pairing (:func:`runner.state.ledger.verify_file`);
6. *contract*: ``task.json`` verifies (schema, digest) and is the one the envelope names;
   ``task.dsse.json`` verifies against a trusted issuer key and signs exactly it;
7. *statement*: ``result.intoto.json`` (SLSA provenance) and ``result.envelope.intoto.json``
   verify against a trusted runner key; the provenance is of this runner's build type, signs
   the bundled ``result.json`` and names its contract; the envelope statement's predicate is
   the bundled envelope; each file either signs is bundled with that digest (a result signed
   before provenance has the envelope statement alone, as ``result.intoto.json``);
8. *envelope*: every file it hashed is bundled with that digest, and the ledger's
   ``job.finished`` names it (or, once re-graded, an earlier revision bundled in record/);
9. *measurements*: each value, re-parsed from the bundled evidence with the parser (id,
   version) the envelope records, is the envelope's value;
10. *inputs*: each bundled input file hashes to its entry in the input manifest.

A signature that only a key the bundle carries verifies (none trusted here), and an unsigned
contract, are reported UNVERIFIED: a problem, unless ``allow_untrusted``. Nothing here
imports the docker SDK or talks to an engine.

The checks of fixity (1, 3, 4) are in :mod:`.fixity`, those of signatures (2, 6, 7) in
:mod:`.signatures`, what they share in :mod:`.bag`; here is their order (one sequence over one
unpacked bag, each check recording what it found, so that the order in which problems are
found, and so the file the first one names, is read in one place) and the checks of the run's
own record (5, 8, 9, 10).
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from pydantic import ValidationError

from runner.core import jsondepth
from runner.evidence import read as evidence
from runner.models.envelope import ResultEnvelope
from runner.results.bundle import blobs_dir, output_files
from runner.results.bundle.bag import (
    CONTRACT,
    ENVELOPE,
    INPUT_MANIFEST,
    LEDGER,
    Check,
    Keys,
    MiB,
    Problem,
    Report,
    Status,
    Stop,
)
from runner.results.bundle.fixity import FixityChecks, extract
from runner.results.bundle.signatures import SignatureChecks
from runner.state import ledger

__all__ = ["Check", "Keys", "Problem", "Report", "verify"]

MAX_LEDGER_BYTES = 256 * MiB
MAX_LEDGER_LINES = 500_000
"""The most of a bundle's ledger that is checked: a heartbeat is a line, every 5 s by default,
so 29 days of a job's running (about 200 MB of lines). A ledger past either is one problem,
not read, where a 4 KB archive of a million-line ledger had taken 14 s and 790 MB to report a
problem a line."""
MAX_LEDGER_PROBLEMS = 100
"""The most problems of a bundle's ledger listed one by one; the rest are counted."""


def verify(
    archive: Path,
    *,
    keys: Keys,
    blobs: Path | None = None,
    allow_untrusted: bool = False,
    max_total: int = 64 * 1024 * MiB,
    max_files: int = 200_000,
    inspect: Callable[[Path, Mapping[str, Path]], None] | None = None,
) -> Report:
    """Check the bundle at ``archive`` (files stored beside it in ``blobs``, default
    ``<archive>.blobs``); every problem found is in the report, the first one first.

    ``inspect(top, beside)``, when given, is called once the checks have run and while the
    bag is still unpacked (never when it could not be): ``top`` is the bag's folder (its job
    folder is ``top/data``), ``beside`` maps each payload file stored beside the archive
    (``data/...``) to its checked blob. `runner report BUNDLE` reads the run's files through
    it, so a bundle is unpacked (with every cap) once, by this code alone."""
    report = Report(str(archive))
    with tempfile.TemporaryDirectory(prefix="runner-verify-bundle-") as tmp:
        try:
            top, afterwards = extract(archive, Path(tmp), max_total, max_files, report)
        except Stop:
            return report
        report.bag = top.name
        verifier = _Verifier(top, blobs or blobs_dir(archive), keys, allow_untrusted, report)
        verifier.run()
        if inspect is not None:
            inspect(top, dict(verifier.beside))
    if afterwards:
        # Bytes that carry no file (tar padding, what follows the end, the gzip trailer):
        # reported after the files, so that a damaged header is named by the files it hides.
        report.problems += afterwards
        report.checks[0] = Check("archive", "failed", str(afterwards[0]))
    return report


class _Verifier(FixityChecks, SignatureChecks):
    def run(self) -> None:
        steps: list[tuple[str, Callable[[], str | None]]] = [
            ("seal", self.seal),
            ("tag files", self.tag_files),
            ("payload", self.payload),
            ("envelope", self.load_envelope),
            ("ledger", self.check_ledger),
            ("contract", self.check_contract),
            ("statement", self.statement),
            ("files", self.envelope_files),
            ("measurements", self.measurements),
            ("inputs", self.inputs),
        ]
        for i, (name, step) in enumerate(steps):
            before = len(self.report.problems)
            warned = len(self.report.warnings)
            try:
                detail = step()
            except Stop:
                self.record(name, before, warned, None)
                for later, _ in steps[i + 1 :]:
                    self.report.checks.append(
                        Check(later, "not run", f"not run after the {name} check failed")
                    )
                return
            self.record(name, before, warned, detail)

    def record(self, name: str, before: int, warned: int, detail: str | None) -> None:
        new = self.report.problems[before:]
        if new:
            status: Status = "failed"
            if all(p.message.startswith("UNVERIFIED") for p in new):
                status = "unverified"
            detail = str(new[0]).replace("UNVERIFIED: ", "", 1)
            self.report.checks.append(Check(name, status, detail))
        elif len(self.report.warnings) > warned:
            detail = self.report.warnings[-1].replace("UNVERIFIED: ", "", 1)
            self.report.checks.append(Check(name, "unverified", detail))
        else:
            self.report.checks.append(Check(name, "ok", detail or ""))

    # -- the checks of the run's record ------------------------------------------------------

    def load_envelope(self) -> str:
        raw = self.read(ENVELOPE, 64 * MiB)
        if raw is None:
            self.problem(ENVELOPE, "is missing: the bundle has no result")
            raise Stop
        try:
            self.envelope = ResultEnvelope.model_validate_json(raw)
        except ValidationError as exc:
            self.problem(ENVELOPE, f"is not a result envelope: {str(exc).splitlines()[0]}")
            raise Stop from None
        self.envelope_raw = raw
        self.report.job_id = self.envelope.jobId
        self.report.status = self.envelope.status
        return (
            f"job {self.envelope.jobId}, {self.envelope.status}, revision {self.envelope.revision}"
        )

    def check_ledger(self) -> str | None:
        path = self.top / LEDGER
        if not path.is_file():
            if self.envelope is not None and self.envelope.budget is not None:
                self.problem(LEDGER, "is missing; the envelope records a budget from it")
            return "no ledger: the job was refused before it had one"
        size = path.stat().st_size  # the unpacker writes no link: the file itself
        lines = path.read_bytes().count(b"\n") if size <= MAX_LEDGER_BYTES else 0
        if size > MAX_LEDGER_BYTES or lines > MAX_LEDGER_LINES:
            self.problem(
                LEDGER,
                f"is {size:,} bytes in {lines:,} lines, past what is checked "
                f"({MAX_LEDGER_BYTES:,} bytes, {MAX_LEDGER_LINES:,} lines): not read",
            )
            return "ledger not checked: too long"
        problems = ledger.verify_file(path)
        for p in problems[:MAX_LEDGER_PROBLEMS]:
            self.problem(LEDGER, str(p))
        if len(problems) > MAX_LEDGER_PROBLEMS:
            more = len(problems) - MAX_LEDGER_PROBLEMS
            self.problem(LEDGER, f"... and {more:,} more problems, not listed")
        self.ledger_state = ledger.read_state(path)
        return f"{lines} events, chain and order intact"

    def envelope_files(self) -> str:
        env = self.loaded()
        hashed: set[str] = set()
        for path, digest, _ in output_files(env):
            rel = self.payload_path(path)
            if digest is None or rel in hashed:
                continue
            have = self.digests.get(rel)
            hashed.add(rel)
            if have is None:
                self.problem(
                    rel or path, f"is hashed in the envelope but not in the bundle{self.why(rel)}"
                )
            elif f"sha256:{have}" != digest:
                self.problem(rel, f"sha256 is {have}; the envelope recorded {digest}")
        finished = self.ledger_state.finished if self.ledger_state else None
        if finished is None:
            return f"{len(hashed)} files it hashed are bundled as it says"
        want = finished.get("envelopeSha256")
        have = "sha256:" + hashlib.sha256(self.envelope_raw).hexdigest()
        if env.revision <= 1 and want != have:
            self.problem(ENVELOPE, f"is {have}; the ledger's job.finished names {want}")
        elif env.revision > 1 and want not in self.earlier_envelopes():
            self.problem(
                LEDGER,
                f"its job.finished names envelope {want}, which is no earlier revision bundled "
                "under data/record/",
            )
        names = "it" if env.revision <= 1 else "the revision it re-grades (in data/record/)"
        return f"{len(hashed)} files it hashed are bundled as it says; the ledger names {names}"

    def earlier_envelopes(self) -> set[str]:
        return {
            f"sha256:{digest}"
            for name, digest in self.digests.items()
            if name.startswith("data/record/") and re.fullmatch(r"result-.*\.json", Path(name).name)
        }

    def measurements(self) -> str | None:
        env, contract = self.loaded(), self.contract
        if contract is None:
            if env.measurements:
                self.problem(CONTRACT, "without the contract no value can be re-parsed")
            return None
        budget = evidence.ParseBudget()  # one for all: the envelope may list thousands
        seen: set[str] = set()
        repeated: list[str] = []
        for m in env.measurements:
            if m.measurementId in seen:  # re-parsed once; a runner writes each once
                repeated.append(m.measurementId)
                continue
            seen.add(m.measurementId)
            rel = self.payload_path(m.evidence.path)
            bundled = rel in self.digests and rel not in self.absent
            path = self.beside.get(rel, self.top / rel) if bundled else None
            try:
                value = evidence.reparse(m, contract, path, "not bundled", budget)
            except evidence.NotConfirmed as exc:
                self.problem((rel or ENVELOPE) if exc.of_evidence else ENVELOPE, exc.message)
                continue
            self.report.measurements[m.measurementId] = value
        if repeated:
            self.problem(
                ENVELOPE,
                f"{len(repeated):,} measurement entries repeat an id listed before them (the "
                f"first: {repeated[0]!r}); a runner lists each measurement once",
            )
        return (
            ", ".join(f"{k} = {v!r}" for k, v in self.report.measurements.items())
            or "no measurement to re-parse"
        )

    def inputs(self) -> str | None:
        raw = self.read(INPUT_MANIFEST, 64 * MiB)
        if raw is None:
            return "no input manifest"
        try:
            entries = {str(e["path"]): str(e["sha256"]) for e in jsondepth.loads(raw)["files"]}
        except (ValueError, TypeError, KeyError) as exc:
            self.problem(INPUT_MANIFEST, f"is not an input manifest: {exc}")
            return None
        bundled = {k: v for k, v in self.digests.items() if k.startswith("data/input/")}
        for rel, have in sorted(bundled.items()):
            want = entries.get(rel.removeprefix("data/input/"))
            if want is None:
                self.problem(rel, "is not in the input manifest")
            elif want.removeprefix("sha256:") != have:
                self.problem(rel, f"sha256 is {have}; the input manifest says {want}")
        return f"{len(bundled)} of {len(entries)} input files bundled, each as the manifest says"
