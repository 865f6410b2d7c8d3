"""The signature checks of ``runner verify-bundle``: DSSE envelopes verified against the keys
the auditor trusts (an UNVERIFIED problem, or warning, when only a key the bundle carries
verifies one), the seal over the tag manifest, the contract (``task.json`` and the issuer's
``task.dsse.json``), and the result's in-toto statements (SLSA provenance, the envelope
statement) with every file they sign.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from runner.contract import parse_json, verify_data
from runner.core import jsondepth, safefs
from runner.core.errors import Category, RunnerError, SignatureInvalid
from runner.results import attest
from runner.results.bundle import INFO_FILE, INFO_KIND, SEAL_FILE, SEAL_PREDICATE, TAGMANIFEST
from runner.results.bundle.bag import (
    CONTRACT,
    ENVELOPE,
    ENVELOPE_STATEMENT,
    SIGNED_CONTRACT,
    STATEMENT,
    Bag,
    MiB,
    Stop,
)
from runner.results.bundle.fixity import sha256_file
from runner.trust import signing

__all__ = ["SignatureChecks"]


def _carried(info: dict[str, Any], role: str) -> list[signing.TrustedKey]:
    """The public keys runner-bundle.json carries for ``role``: to tell damage from an
    unknown signer, never to trust."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    out = []
    keys = info.get("keys")
    for pem in keys.get(role, []) if isinstance(keys, dict) else []:
        try:
            public = serialization.load_pem_public_key(str(pem).encode())
        except (ValueError, TypeError):
            continue
        if isinstance(public, Ed25519PublicKey):
            out.append(signing.TrustedKey(signing.key_id(public), public, "carried in the bundle"))
    return out


class SignatureChecks(Bag):
    """The checks of what is signed: the seal, the contract, the result's statements."""

    def signed(
        self, rel: str, raw: bytes, payload_type: str, role: Literal["runner", "issuer"]
    ) -> tuple[bytes | None, str]:
        """The payload of the DSSE envelope ``raw`` and who signed it, if a trusted key of
        ``role`` verifies it; when only a key the bundle carries does, the payload too, with
        an UNVERIFIED problem (or warning, when allowed). None when nothing verifies it."""
        try:
            envelope = jsondepth.loads(raw)
            if not isinstance(envelope, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as exc:
            self.problem(rel, f"is not a DSSE envelope: {exc}", Category.SIGNATURE_INVALID)
            return None, ""
        trusted = self.keys.runner if role == "runner" else self.keys.issuer
        why = f"no {role} key is trusted here"
        if trusted:
            try:
                verified = signing.verify_envelope(envelope, trusted, 1, payload_type)
            except SignatureInvalid as exc:
                why = exc.message
            else:
                sources = {k.keyid: k.source for k in trusted}
                by = ", ".join(f"{k} ({sources[k]})" for k in verified.keyids)
                return verified.payload, f"signed by {by}"
        carried = _carried(self.info, role)
        try:
            verified = signing.verify_envelope(envelope, carried, 1, payload_type)
        except SignatureInvalid as exc:
            if trusted or carried or "no trusted keys" not in exc.message:
                nor = ", nor with the key the bundle carries" if carried else ""
                self.problem(
                    rel,
                    f"its signature does not verify with any trusted {role} key{nor} ({why})",
                    Category.SIGNATURE_INVALID,
                )
                return None, ""
            self.untrusted(
                rel, f"UNVERIFIED: {why}, and the bundle carries no {role} key to check it with",
                role,
            )  # fmt: skip
            return None, ""
        ids = ", ".join(verified.keyids)
        note = (
            f"UNVERIFIED: signed by {ids}, the {role}'s key the bundle carries, which is not "
            f"trusted here ({why}); it proves the file undamaged, not who made it"
        )
        self.untrusted(rel, note, role)
        return verified.payload, f"signed by {ids} (untrusted)"

    def untrusted(self, rel: str, note: str, role: str) -> None:
        """What no trusted key vouches for: a warning when allowed, else a problem."""
        if self.allow_untrusted:
            self.report.warnings.append(f"{rel}: {note}")
            return
        fix = "--key" if role == "runner" else "--issuer-key"
        self.problem(
            rel,
            f"{note}; pass {fix} with the {role}'s public key, or --allow-untrusted",
            Category.SIGNATURE_INVALID,
        )

    # -- the checks -------------------------------------------------------------------------

    def seal(self) -> str | None:
        info_raw = self.read(INFO_FILE, 16 * MiB)
        try:
            info = jsondepth.loads(info_raw) if info_raw is not None else {}
        except (ValueError, UnicodeDecodeError):
            info = {}
        if isinstance(info, dict) and info.get("kind") == INFO_KIND:
            self.info = info
        raw = self.read(SEAL_FILE, MiB)
        if raw is None:
            self.problem(SEAL_FILE, "is missing: the bag is not sealed", Category.SIGNATURE_INVALID)
            return None
        payload, by = self.signed(SEAL_FILE, raw, attest.PAYLOAD_TYPE, "runner")
        if payload is None:
            return None
        try:
            stmt = jsondepth.loads(payload)
            if stmt.get("_type") != attest.STATEMENT_TYPE:
                raise ValueError("not an in-toto statement")
            if stmt.get("predicateType") != SEAL_PREDICATE:
                raise ValueError(f"its predicateType is {stmt.get('predicateType')!r}")
            (want,) = [
                s["digest"]["sha256"] for s in stmt["subject"] if s.get("name") == TAGMANIFEST
            ]
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self.problem(SEAL_FILE, f"is not a bundle seal: {exc}")
            return None
        try:
            have = sha256_file(self.top / TAGMANIFEST)
        except (safefs.UnsafePath, OSError):
            self.problem(TAGMANIFEST, "is missing: nothing in the bag is covered")
            raise Stop from None
        if have != want:
            self.problem(TAGMANIFEST, f"sha256 is {have}; the seal signs {want}")
        return f"{TAGMANIFEST} {by}"

    def check_contract(self) -> str | None:
        env = self.loaded()
        raw = self.read(CONTRACT, 4 * MiB)
        if raw is None:
            self.problem(CONTRACT, "is missing: the values cannot be re-parsed without it")
            return None
        try:
            contract = verify_data(
                parse_json(raw, CONTRACT), raw, self.top / "data" / "input", CONTRACT
            )
        except RunnerError as exc:
            self.problem(CONTRACT, exc.message)
            return None
        if contract.digest != env.contractDigest:
            self.problem(CONTRACT, f"is {contract.digest}; the envelope names {env.contractDigest}")
            return None
        self.contract = contract
        signed = env.signature is not None and env.signature.status == "verified"
        dsse = self.read(SIGNED_CONTRACT, 8 * MiB)
        if dsse is None:
            if signed:
                self.problem(
                    SIGNED_CONTRACT, "is missing; the envelope says the contract was signed"
                )
                return None
            note = "UNVERIFIED: the contract was not signed (the run was local development)"
            if self.allow_untrusted:
                self.report.warnings.append(f"{CONTRACT}: {note}")
            else:
                self.problem(
                    CONTRACT, f"{note}; pass --allow-untrusted to accept it",
                    Category.SIGNATURE_INVALID,
                )  # fmt: skip
            return None
        payload, by = self.signed(SIGNED_CONTRACT, dsse, signing.PAYLOAD_TYPE, "issuer")
        if payload is not None and payload != raw:
            self.problem(SIGNED_CONTRACT, f"signs other bytes than {CONTRACT}")
        if not signed:
            self.problem(
                SIGNED_CONTRACT, "is there, but the envelope says the contract was unsigned"
            )
        return f"{contract.digest}, {by}"

    def statement(self) -> str | None:
        raw = self.read(STATEMENT, 64 * MiB)
        if raw is None:
            self.problem(
                STATEMENT, "is missing: the result is not signed", Category.SIGNATURE_INVALID
            )
            return None
        stmt, files, by = self.result_statement(STATEMENT, raw)
        if stmt is None:
            return None
        if stmt.get("predicateType") == attest.ENVELOPE_PREDICATE_TYPE:
            # A result signed before SLSA provenance: the envelope statement alone.
            count = self.envelope_statement(STATEMENT, stmt, files)
            return f"{by}; its {count} files and the envelope are the bundled ones"
        count = self.provenance(stmt, files)
        raw = self.read(ENVELOPE_STATEMENT, 64 * MiB)
        if raw is None:
            self.problem(
                ENVELOPE_STATEMENT,
                f"is missing: {STATEMENT} is there, the envelope's own statement is not",
                Category.SIGNATURE_INVALID,
            )
            return None
        envelope_stmt, files, _ = self.result_statement(ENVELOPE_STATEMENT, raw)
        if envelope_stmt is not None:
            self.envelope_statement(ENVELOPE_STATEMENT, envelope_stmt, files)
        many = f"{count} output file{'s' if count != 1 else ''}"
        return f"{by}; its provenance (result.json, {many}) and envelope statement match the bag"

    def result_statement(
        self, rel: str, raw: bytes
    ) -> tuple[dict[str, Any] | None, dict[str, str], str]:
        """The in-toto statement in ``rel``, the files it signs and who signed it, if a
        runner key verifies it and it is one of the runner's two (None after recording a
        problem)."""
        payload, by = self.signed(rel, raw, attest.PAYLOAD_TYPE, "runner")
        if payload is None:
            return None, {}, by
        try:
            stmt = jsondepth.loads(payload)
            if stmt.get("_type") != attest.STATEMENT_TYPE:
                raise ValueError("not an in-toto statement")
            kind = stmt.get("predicateType")
            if kind not in (attest.PROVENANCE_TYPE, attest.ENVELOPE_PREDICATE_TYPE):
                raise ValueError(f"its predicateType is {kind!r}")
            files = dict(attest.signed_files(stmt))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self.problem(rel, f"is not a runner result statement: {exc}")
            return None, {}, by
        return stmt, files, by

    def provenance(self, stmt: dict[str, Any], files: dict[str, str]) -> int:
        """SLSA provenance: of this runner's build type, signing the bundled result.json and
        output files, made from the contract the envelope names."""
        build = stmt["predicate"].get("buildDefinition", {})
        if build.get("buildType") != attest.BUILD_TYPE:
            self.problem(
                STATEMENT, f"is provenance of another build type: {build.get('buildType')!r}"
            )
        files = dict(files)
        want = files.pop(attest.ENVELOPE_FILE, None)
        have = hashlib.sha256(self.envelope_raw).hexdigest()
        if want != have:
            self.problem(ENVELOPE, f"sha256 is {have}; {STATEMENT} signs {want}")
        contract = self.loaded().contractDigest
        deps = {
            f"sha256:{d.get('digest', {}).get('sha256')}"
            for d in build.get("resolvedDependencies", [])
            if str(d.get("name", "")).startswith("contract:")
        }
        if contract is not None and deps != {contract}:
            self.problem(STATEMENT, f"names contract {sorted(deps)}; the envelope ran {contract}")
        self.signed_outputs(STATEMENT, files)
        return len(files)

    def envelope_statement(self, rel: str, stmt: dict[str, Any], files: dict[str, str]) -> int:
        """The envelope as the predicate: the bundled one, and its files the bundled ones."""
        if stmt.get("predicateType") != attest.ENVELOPE_PREDICATE_TYPE:
            self.problem(rel, f"its predicateType is {stmt.get('predicateType')!r}")
        if stmt.get("predicate") != jsondepth.loads(self.envelope_raw):
            self.problem(ENVELOPE, f"is not the envelope that {rel} signs")
        self.signed_outputs(rel, files)
        return len(files)

    def signed_outputs(self, rel: str, files: dict[str, str]) -> None:
        for name, want in files.items():
            path = self.payload_path(name.removeprefix("output/"))
            have = self.digests.get(path) if path and name.startswith("output/") else None
            if have is None:
                self.problem(rel, f"signs {name}, which is not in the bundle{self.why(path)}")
            elif have != want:
                self.problem(path, f"sha256 is {have}; the signed statement says {want}")
