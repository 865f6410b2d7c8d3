"""The execution contract: models, parsing and verification."""

from runner.contract.load import (
    SignatureInfo,
    Trust,
    VerifiedContract,
    canonical_digest,
    load_contract,
    parse_json,
    verify_data,
    with_digest,
)
from runner.contract.models import ExecutionContract

__all__ = [
    "ExecutionContract",
    "SignatureInfo",
    "Trust",
    "VerifiedContract",
    "canonical_digest",
    "load_contract",
    "parse_json",
    "verify_data",
    "with_digest",
]
