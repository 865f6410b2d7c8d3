"""Reading a contract: bytes → (DSSE signature) → JSON → schema → digest → parser bindings
→ VerifiedContract.

Every refusal is a :class:`~runner.core.errors.ContractError` naming the JSON path of the field,
what
was found and what was expected.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import rfc8785
from pydantic import ValidationError

from runner.contract.models import ExecutionContract
from runner.core import jsondepth
from runner.core.cpulimit import OverCpu, cpu_limit
from runner.core.errors import ContractError, DigestMismatch, SignatureInvalid
from runner.core.safefs import UnsafePath, read_named

if TYPE_CHECKING:
    from runner.trust.signing import TrustedKey

__all__ = [
    "CHECK_SECONDS",
    "MAX_CONTRACT_BYTES",
    "SignatureInfo",
    "Trust",
    "VerifiedContract",
    "canonical_digest",
    "is_envelope",
    "json_path",
    "load_contract",
    "parse_json",
    "validation_error",
    "verify_data",
    "with_digest",
]


def is_envelope(data: dict[str, Any]) -> bool:
    """Whether parsed JSON looks like a DSSE envelope rather than a bare contract."""
    return "payloadType" in data or "signatures" in data or "payload" in data


MAX_CONTRACT_BYTES = 4 * 1024 * 1024
CHECK_SECONDS = 10.0
"""The CPU time checking a contract's parser configs may take, all together (each regular
expression is compiled: a case-insensitive one with large character ranges costs up to 0.6 ms a
character; a contract may hold thousands)."""


@dataclass(frozen=True)
class Trust:
    """The keys this host trusts and how many distinct ones must have signed. Keys are given,
    or read from ``folder`` when a signed contract first needs them (so unsigned work never
    loads the cryptography)."""

    keys: list[TrustedKey] | None = None
    threshold: int = 1
    folder: Path | None = None

    def trusted(self) -> list[TrustedKey]:
        if self.keys is not None:
            return self.keys
        from runner.trust import signing

        return signing.load_trusted_keys(self.folder) if self.folder else []


@dataclass(frozen=True)
class SignatureInfo:
    """Who signed a contract: key ids recomputed from the trusted keys that verified."""

    keyids: tuple[str, ...]
    payload_type: str
    envelope: bytes
    """The DSSE envelope bytes as received; staged beside task.json."""


@dataclass(frozen=True)
class VerifiedContract:
    """A contract whose JSON, schema, digest and parser bindings all checked out."""

    model: ExecutionContract
    raw: bytes
    """The exact bytes that were verified; staged as /job/input/task.json."""
    data: dict[str, Any]
    digest: str
    base_dir: Path
    """The folder relative paths (paper, repository) are resolved against."""
    source: str
    """Where the contract came from, for messages."""
    signature: SignatureInfo | None = None
    """None for an unsigned contract."""


def canonical_digest(data: dict[str, Any]) -> str:
    """``sha256:<hex>`` of the RFC 8785 canonical JSON of ``data`` without ``contractDigest``."""
    body = {k: v for k, v in data.items() if k != "contractDigest"}
    try:
        canonical = rfc8785.dumps(body)
    except (rfc8785.CanonicalizationError, ValueError, TypeError) as exc:
        raise ContractError(f"cannot be canonicalized (RFC 8785): {exc}", path="$") from exc
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ContractError(
                f"key {key!r} appears twice in one object",
                hint="a signed contract must be unambiguous; keep one value per key",
            )
        out[key] = value
    return out


def parse_json(raw: bytes, source: str) -> dict[str, Any]:
    """Parse contract bytes, refusing bad UTF-8, bad JSON, duplicate keys and non-objects."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContractError(f"{source} is not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    try:
        data = jsondepth.loads(text, jsondepth.CONTRACT_DEPTH, object_pairs_hook=_refuse_duplicates)
    except jsondepth.TooDeep as exc:  # found before anything recursed over it, json.loads first
        raise ContractError(
            f"{source} nests arrays and objects more than {exc.cap} levels deep; the first "
            "one too deep is here",
            path=exc.path,
            hint=f"keep the document, parser configs included, within {exc.cap} levels",
        ) from None
    except json.JSONDecodeError as exc:
        raise ContractError(
            f"{source} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            hint="check the file with `python3 -m json.tool FILE`",
        ) from exc
    except (ValueError, RecursionError) as exc:
        # Python's own limits: integers of over 4300 digits, nesting deeper than its stack.
        raise ContractError(
            f"{source} is beyond what a contract may hold: {str(exc).split(';')[0]}",
            hint="contracts hold ordinary numbers and shallow objects",
        ) from exc
    if not isinstance(data, dict):
        raise ContractError(f"must be a JSON object, got {type(data).__name__}", path="$")
    return data


def json_path(loc: tuple[int | str, ...]) -> str:
    """``('measurements', 0, 'parser')`` → ``$.measurements[0].parser``."""
    out = "$"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


_UNION_TAGS = frozenset({"int", "asset", "carried"})
"""Tags of the models' unions (an asset fetched or carried): never a field's name."""


def _union_tag(part: str) -> bool:
    return "[" in part or part in _UNION_TAGS


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def validation_error(exc: ValidationError, what: str = "contract") -> ContractError:
    """Turn pydantic's errors into one ContractError naming every offending JSON path."""
    found: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False):
        # pydantic adds union-branch tags such as 'int' or "literal['none','all']": not fields.
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and _union_tag(p)))
        if err["type"] == "extra_forbidden":
            body = f"unknown field (not part of the {what} schema)"
        elif err["type"] == "missing":
            body = "required field is missing"
        else:
            body = f"{err['msg'].removeprefix('Value error, ')} (got {_short(err.get('input'))})"
        found.append((json_path(loc), body))
    hint = "correct the field; contracts/execution-contract.schema.json documents each one"
    if len(found) == 1:
        return ContractError(found[0][1], path=found[0][0], hint=hint)
    listed = "\n  ".join(f"{where}: {body}" for where, body in found)
    return ContractError(f"{len(found)} fields are wrong:\n  {listed}", hint=hint)


def verify_data(
    data: dict[str, Any],
    raw: bytes,
    base_dir: Path,
    source: str,
    signature: SignatureInfo | None = None,
) -> VerifiedContract:
    """Check schema, digest and parser bindings of already-parsed contract data."""
    # Imported here: parsers import the error tree only, but keep the contract package leaf-like.
    from runner.parsers import registry

    try:
        model = ExecutionContract.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from exc
    digest = canonical_digest(data)
    if model.contractDigest != digest:
        raise DigestMismatch(
            f"contractDigest is {model.contractDigest} but the contract hashes to {digest}",
            path="$.contractDigest",
            hint=(
                "the contract was changed after it was digested; if the change is intended, "
                "re-issue it with `runner pin CONTRACT --image IMAGE`, which recomputes the digest"
            ),
        )
    i = 0
    try:
        with cpu_limit(CHECK_SECONDS):  # a pattern can cost 0.6 ms a character to compile
            for i, m in enumerate(model.measurements):
                registry.check_binding(m.parser, path=f"$.measurements[{i}].parser")
    except OverCpu:
        raise ContractError(
            f"checking the parsers' configs took over {CHECK_SECONDS:g} s of CPU time "
            f"(stopped at measurement {i})",
            path=f"$.measurements[{i}].parser.config",
            hint="simplify the regular expressions (a case-insensitive pattern with large "
            "character ranges is the slowest to compile), or split the measurements "
            "over several contracts",
        ) from None
    return VerifiedContract(
        model=model,
        raw=raw,
        data=data,
        digest=digest,
        base_dir=base_dir,
        source=source,
        signature=signature,
    )


def load_contract(path: Path, trust: Trust | None = None) -> VerifiedContract:
    """Read and verify the contract at ``path``: a bare contract, or a DSSE envelope whose
    signatures are checked against ``trust`` before its payload is parsed."""
    try:
        raw = read_named(path, MAX_CONTRACT_BYTES)
    except UnsafePath as exc:
        if exc.missing:
            raise ContractError(f"no contract at {path}", hint="check the path") from None
        raise ContractError(
            f"{path} {exc.problem}; a contract is a JSON file of at most 4 MiB",
            hint="pass the task.json (or task.dsse.json) file",
        ) from None
    except IsADirectoryError as exc:
        raise ContractError(f"{path} is a directory", hint="pass the task.json file") from exc
    except OSError as exc:
        raise ContractError(f"cannot read {path}: {exc.strerror}") from exc
    data = parse_json(raw, str(path))
    base_dir = path.resolve().parent
    if not is_envelope(data):
        return verify_data(data, raw, base_dir, str(path))
    if trust is None:
        raise SignatureInvalid(
            f"{path} is a signed envelope and no trusted keys were given to check it",
            hint="configure trusted keys (--trusted-keys DIR or RUNNER_TRUSTED_KEYS)",
        )
    from runner.trust import signing  # cryptography is imported only for signed contracts

    verified = signing.verify_envelope(data, trust.trusted(), trust.threshold)
    info = SignatureInfo(verified.keyids, verified.payload_type, raw)
    payload = parse_json(verified.payload, f"{path} (signed payload)")
    return verify_data(payload, verified.payload, base_dir, str(path), signature=info)


def with_digest(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` with ``contractDigest`` recomputed (issuer side)."""
    out = {k: v for k, v in data.items() if k != "contractDigest"}
    out["contractDigest"] = canonical_digest(out)
    return out
