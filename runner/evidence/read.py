"""Reading measurements from the job's evidence files through the registered parsers, and
reading them again to confirm a signed result (`runner verify-bundle`, `runner verify-result`).

Every parse runs within a :class:`ParseBudget`: the CPU time for all of one job's (or one
verification's) parsing, so that no evidence, contract or envelope makes the runner parse for
longer than the evidence's size warrants."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from runner.contract import VerifiedContract, parse_json, verify_data
from runner.contract.models import Measurement
from runner.core.cpulimit import OverCpu, cpu_limit
from runner.core.errors import EvidenceError, EvidenceParseError, MissingEvidence, RunnerError
from runner.core.redaction import quote
from runner.core.safefs import UnsafePath
from runner.models.envelope import (
    EvidenceRef,
    FileRef,
    MeasurementError,
    MeasurementResult,
    ParserRef,
    ResultEnvelope,
)
from runner.parsers import registry
from runner.staging.jobdir import job_file_problem, sha256_under

__all__ = [
    "NOT_GIVEN",
    "PARSE_SECONDS",
    "PARSE_SECONDS_MAX",
    "PARSE_SECONDS_PER_MIB",
    "NotConfirmed",
    "ParseBudget",
    "confirm_values",
    "hash_logs",
    "read_measurements",
    "reparse",
]


PARSE_SECONDS = 10.0
"""CPU time one parse may take before what its file earns (:data:`PARSE_SECONDS_PER_MIB`), and
all of a job's parses together before what each of them earns."""
PARSE_SECONDS_PER_MIB = 1.0
"""CPU time each parse earns for each MiB its file holds on disk: over ten times the slowest
ordinary parse measured (``regex.scalar`` with ``\\bstep (\\d+)\\b.*\\bloss=(\\S+)``
on a log of short lines it matches every one of, 77 ms a MiB)."""
PARSE_SECONDS_MAX = 3600.0
"""The most CPU time one job's parsing may take, however many measurements and MiB."""
REASON_MAX = 2000
"""The longest reason kept for a measurement that failed (a contract's pattern is quoted)."""

_T = TypeVar("_T")


class ParseBudget:
    """The CPU time for parsing one job's evidence (or one verification's re-parsing).

    One parse may take :data:`PARSE_SECONDS` plus :data:`PARSE_SECONDS_PER_MIB` for each MiB
    of its own file's allocated bytes (a sparse file's holes earn nothing: a 16 GiB file of a
    few KiB on disk earned 4.5 hours when its size counted), and no more than what is left of
    the job's: :data:`PARSE_SECONDS` and what each distinct parse (file, parser and config:
    a contract or an envelope repeating a measurement earns nothing more) earns by its file,
    at most :data:`PARSE_SECONDS_MAX` in all. So a large file funds its own parse only, never
    another measurement's over a small log. A parse runs under
    :func:`runner.core.cpulimit.cpu_limit`; one that uses up its time raises
    :class:`~runner.core.errors.EvidenceParseError`, as does one with none left, at once. A
    contract's regular expression is what can take long: Python's ``re`` backtracks
    (``(\\d+)\\.(\\d+)`` over one line of 40,000 digits takes 8 s; the time grows with the
    square of the line)."""

    def __init__(self) -> None:
        self.allowed = PARSE_SECONDS
        self.spent = 0.0
        self._earned: set[tuple[object, ...]] = set()

    def _earns(self, path: Path, key: tuple[object, ...]) -> float:
        """What a parse of ``path`` earns; added to the job's, unless a parse of the same
        ``key`` (the file, the parser, its config) added it already."""
        try:
            st = os.lstat(path)
        except OSError:
            return 0.0
        earned = PARSE_SECONDS_PER_MIB * min(st.st_size, st.st_blocks * 512) / 2**20
        if key not in self._earned:
            self._earned.add(key)
            self.allowed = min(PARSE_SECONDS_MAX, self.allowed + earned)
        return earned

    def run(self, what: str, path: Path, key: tuple[object, ...], parse: Callable[[], _T]) -> _T:
        """``parse()`` (of ``path``, told apart by ``key``) within its time; EvidenceParseError
        naming ``what`` when there is none left or it uses up its own."""
        own = PARSE_SECONDS + self._earns(path, key)
        pool = self.allowed - self.spent
        left = min(pool, own)
        if left <= 0.01:
            raise EvidenceParseError(f"{what}: not parsed: {self._spent(False)}", hint=_FASTER)
        start = time.process_time()
        try:
            with cpu_limit(left):
                return parse()
        except OverCpu:
            raise EvidenceParseError(
                f"{what}: stopped after {left:.1f} s of CPU time: {self._spent(own < pool)}",
                hint=_FASTER,
            ) from None
        finally:
            self.spent += time.process_time() - start

    def _spent(self, own: bool) -> str:
        if own:
            return (
                f"the time one measurement's parse may take ({PARSE_SECONDS:g} s and "
                f"{PARSE_SECONDS_PER_MIB:g} s for each MiB its file holds) is spent"
            )
        return (
            f"the CPU time for parsing the job's evidence is spent ({self.allowed:.1f} s for "
            f"all its measurements, at most {PARSE_SECONDS_MAX:g} s)"
        )


_FASTER = (
    "a regular expression that backtracks is the usual cause: anchor it with ^ or begin it "
    "with fixed text, and let no repeat match what the next one may"
)


def _read_one(
    output: Path,
    contract: VerifiedContract,
    index: int,
    max_bytes: int,
    version: str | None,
    hashed: dict[str, tuple[str | None, int]],
    budget: ParseBudget,
) -> MeasurementResult:
    m = contract.model.measurements[index]
    rel = m.parser.evidencePath
    where = f"measurement {m.measurementId!r}"
    if rel not in hashed:  # several measurements often read one log: hash it once
        try:
            hashed[rel] = sha256_under(output, rel, max_bytes)
        except UnsafePath as exc:
            if exc.missing:
                raise MissingEvidence(
                    f"{where}: the job did not write {rel} under /job/output"
                ) from None
            raise EvidenceParseError(f"{where}: {rel} {job_file_problem(exc)}") from None
        except OSError as exc:
            raise EvidenceParseError(f"{where}: {rel} cannot be read: {exc.strerror}") from exc
    sha256, size = hashed[rel]
    if sha256 is None:
        raise EvidenceParseError(
            f"{where}: {rel} is {size:,} bytes, over the host's {max_bytes:,} byte cap for "
            "evidence; it was not read",
            hint="raise maxEvidenceMb in the host policy, or have the job write a smaller file",
        )
    version = version or m.parser.version
    parser = registry.get(m.parser.id, version)
    config = dict(m.parser.config)
    key = (rel, m.parser.id, version, _key(config))
    try:
        value = budget.run(where, output / rel, key, lambda: parser.parse(output / rel, config))
    except EvidenceError:
        raise
    except Exception as exc:  # a job's file is the job's problem, never a runner crash
        raise EvidenceParseError(
            quote(
                f"{where}: {m.parser.id} version {version} could not read {rel}: "
                f"{type(exc).__name__}: {exc}",
                2000,
                "",
            )
        ) from exc
    return MeasurementResult(
        measurementId=m.measurementId,
        metric=m.metric,
        unit=m.unit,
        value=value,
        parser=ParserRef(id=m.parser.id, version=version),
        evidence=EvidenceRef(path=rel, sha256=f"sha256:{sha256}", size=size),
    )


def read_measurements(
    output: Path,
    contract: VerifiedContract,
    max_bytes: int,
    versions: dict[str, str] | None = None,
) -> tuple[list[MeasurementResult], list[MeasurementError]]:
    """Every measurement the evidence yields, and why the others failed. ``versions`` picks
    another parser version per measurement id (re-grading); by default the contract's."""
    results: list[MeasurementResult] = []
    errors: list[MeasurementError] = []
    hashed: dict[str, tuple[str | None, int]] = {}
    budget = ParseBudget()
    for i, m in enumerate(contract.model.measurements):
        try:
            version = (versions or {}).get(m.measurementId)
            results.append(_read_one(output, contract, i, max_bytes, version, hashed, budget))
        except EvidenceError as exc:
            reason = str(exc)  # with its fix, where it names one
            if not reason.startswith("measurement"):
                reason = f"measurement {m.measurementId!r}: {reason}"
            reason = quote(reason, REASON_MAX)
            errors.append(
                MeasurementError(
                    measurementId=m.measurementId,
                    category=exc.category,
                    reason=reason,
                )
            )
    return results, errors


def hash_logs(output: Path, paths: list[str], max_bytes: int) -> list[FileRef]:
    """The job's stdout and stderr files, hashed; one that is missing, a link (anywhere on
    its path), not a regular file or over ``max_bytes`` is recorded with the reason."""
    out = []
    for rel in paths:
        try:
            sha256, size = sha256_under(output, rel, max_bytes)
        except UnsafePath as exc:
            out.append(FileRef(path=rel, exists=False, problem=job_file_problem(exc)))
            continue
        except OSError as exc:
            out.append(FileRef(path=rel, problem=f"cannot be read: {exc.strerror}"))
            continue
        if sha256 is None:
            problem = f"is {size:,} bytes, over the {max_bytes:,} byte cap; not hashed"
            out.append(FileRef(path=rel, size=size, problem=problem))
        else:
            out.append(FileRef(path=rel, sha256=f"sha256:{sha256}", size=size))
    return out


class NotConfirmed(Exception):
    """A recorded measurement that its evidence does not give (:func:`reparse`)."""

    def __init__(self, message: str, *, of_evidence: bool, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.of_evidence = of_evidence
        """True: the problem is the evidence file's; False: the envelope's (its measurement
        is not one the contract binds)."""


_index: list[tuple[VerifiedContract, dict[str, Measurement]]] = []


def _bindings(contract: VerifiedContract) -> dict[str, Measurement]:
    """The contract's measurements by id, made once for the contract a verification re-parses
    (an envelope may list thousands: a search of the list for each was quadratic)."""
    if not _index or _index[0][0] is not contract:
        _index[:] = [(contract, {b.measurementId: b for b in contract.model.measurements})]
    return _index[0][1]


def _key(config: dict[str, Any]) -> str:
    """A parser config as a key (configs are JSON)."""
    return json.dumps(config, sort_keys=True, default=str)


def reparse(
    m: MeasurementResult,
    contract: VerifiedContract,
    evidence: Path | None,
    missing: str,
    budget: ParseBudget | None = None,
) -> bool | int | float | str:
    """The value ``m`` records, read again from ``evidence`` (its file; None when it is not
    at hand, ``missing`` saying so: "not bundled") with the parser id and version ``m``
    records and the config the contract binds to it. Raises :class:`NotConfirmed`, its
    message for the file it names, when the evidence does not give exactly that value (type
    included). Shared by ``runner verify-bundle`` and ``runner verify-result``, each passing
    one ``budget`` for all the values it re-parses (a fresh one when None)."""
    binding = _bindings(contract).get(m.measurementId)
    if (
        binding is None
        or binding.parser.evidencePath != m.evidence.path
        or binding.parser.id != m.parser.id  # a re-grade changes the version, never the id
    ):
        raise NotConfirmed(
            f"measurement {m.measurementId} is not the contract's", of_evidence=False
        )
    if evidence is None:
        raise NotConfirmed(
            f"is {missing}, so {m.measurementId} cannot be re-parsed", of_evidence=True
        )
    name = f"{m.parser.id}@{m.parser.version}"
    try:
        parser = registry.get(m.parser.id, m.parser.version)
    except KeyError:
        raise NotConfirmed(
            f"cannot be re-parsed: parser {name} is not registered here (install the plug-in "
            "that provides it)",
            of_evidence=True,
        ) from None
    config = dict(binding.parser.config)
    budget = budget or ParseBudget()
    key = (str(evidence), m.parser.id, m.parser.version, _key(config))
    try:
        value = budget.run(m.measurementId, evidence, key, lambda: parser.parse(evidence, config))
    except Exception as exc:  # noqa: BLE001 - any failure is the evidence's, reported
        raise NotConfirmed(
            quote(f"does not re-parse with {name}: {type(exc).__name__}: {exc}", 1000, ""),
            of_evidence=True,
        ) from None
    if type(value) is not type(m.value) or value != m.value:
        raise NotConfirmed(
            f"re-parses with {name} to {value!r}; the envelope says {m.measurementId} = "
            f"{m.value!r}",
            of_evidence=True,
        )
    return value


CONTRACT_FILE = "input/task.json"
"""The contract as it ran, in a job folder: its measurements bind each value's parser config."""
CONTRACT_MAX = 64 * 2**20
WHOLE_FOLDER = (
    f"verify the whole job folder (its {CONTRACT_FILE} is the contract as it ran), or pass no "
    "output folder to check the signatures alone"
)


def ran_contract(job_root: Path, digest: str | None) -> VerifiedContract:
    """The contract as it ran: ``input/task.json`` of the job folder, a regular file (no
    link), the one ``digest`` (the envelope's ``contractDigest``) names. Raises
    :class:`NotConfirmed` naming the file and why."""
    path = job_root / CONTRACT_FILE
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > CONTRACT_MAX:
            raise NotConfirmed(
                f"{path} is not a regular file of at most {CONTRACT_MAX // 2**20} MiB: the "
                "values cannot be re-parsed without the contract they were parsed under",
                of_evidence=False,
                hint=WHOLE_FOLDER,
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise NotConfirmed(
            f"{path} cannot be read ({exc.strerror}): the values cannot be re-parsed without "
            "the contract they were parsed under",
            of_evidence=False,
            hint=WHOLE_FOLDER,
        ) from None
    try:
        contract = verify_data(parse_json(raw, str(path)), raw, job_root / "input", str(path))
    except RunnerError as exc:
        raise NotConfirmed(f"{path}: {exc.message}", of_evidence=False) from None
    if contract.digest != digest:
        raise NotConfirmed(
            f"{path} is contract {contract.digest}; the envelope names {digest}", of_evidence=False
        )
    return contract


NOT_GIVEN = (
    "a signed value must be what its evidence gives: this result was not parsed by a runner "
    "from this evidence (or the parser here differs)"
)


def confirm_values(
    job_root: Path, output: Path, signed_envelope: dict[str, Any], signed: dict[str, str]
) -> None:
    """Every value of the envelope re-parsed (:func:`reparse`) from its evidence in
    ``output`` with the job folder's contract (:func:`ran_contract`); ``signed``: the output
    files (path -> hex sha256) that a signature covers and that were checked in ``output``
    (no link, that digest): each value's evidence must be one of them. Raises
    :class:`NotConfirmed` with the file named in its message (``runner verify-result``)."""
    try:
        envelope = ResultEnvelope.model_validate(signed_envelope)
    except ValidationError as exc:
        first = str(exc).splitlines()[0]
        raise NotConfirmed(
            f"the signed envelope is not a result envelope: {first}", of_evidence=False
        ) from None
    if not envelope.measurements:
        return
    contract = ran_contract(job_root, envelope.contractDigest)
    budget = ParseBudget()
    for m in envelope.measurements:
        rel = m.evidence.path
        if f"sha256:{signed.get(rel)}" != m.evidence.sha256:
            raise NotConfirmed(
                f"the envelope's evidence {rel} ({m.evidence.sha256}) is not a file the "
                "statements sign with that digest",
                of_evidence=False,
                hint="a runner signs every evidence file it read a value from",
            )
        try:
            reparse(m, contract, output / rel, "", budget)
        except NotConfirmed as exc:
            where = output / rel if exc.of_evidence else "the signed envelope"
            raise NotConfirmed(f"{where}: {exc.message}", of_evidence=exc.of_evidence) from None
