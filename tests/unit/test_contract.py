"""Contract parsing and verification: pure logic, no engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from runner.app.schemas import CONTRACTS
from runner.app.schemas import main as schemas_main
from runner.contract import canonical_digest, load_contract, with_digest
from runner.core.errors import ContractError, DigestMismatch, PolicyViolation, ProtocolAmbiguous
from runner.planning import plan
from runner.planning.policy import HostPolicy
from tests.support import SEED, TOY, run_cli

ID = "sha256:" + "ab" * 32


def _write(tmp_path: Path, data: dict[str, Any], *, redigest: bool = True) -> Path:
    path = tmp_path / "task.json"
    path.write_text(json.dumps(with_digest(data) if redigest else data))
    return path


def _toy() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((TOY / "task.json").read_text())
    data["environment"]["image"] = ID
    return data


def test_seed_contract_digest_verifies() -> None:
    """The seed contract's own contractDigest is the RFC 8785 digest of the rest of it."""
    contract = load_contract(SEED)
    assert contract.digest == json.loads(SEED.read_text())["contractDigest"]
    assert contract.digest == (
        "sha256:38dbd33676f1dbf2381d9548ef77ae5264410e3a714bf0f83c7529cfebd8d579"
    )


def test_one_byte_change_is_refused(tmp_path: Path) -> None:
    """Changing one byte of a digested contract makes it fail with DigestMismatch."""
    raw = SEED.read_bytes()
    changed = raw.replace(b'"cpus": 2', b'"cpus": 3', 1)
    assert len(changed) == len(raw) and changed != raw
    path = tmp_path / "task.json"
    path.write_bytes(changed)
    with pytest.raises(DigestMismatch) as err:
        load_contract(path)
    assert err.value.path == "$.contractDigest"
    assert "runner pin" in str(err.value)


def test_malformed_json_names_line_and_column(tmp_path: Path) -> None:
    """Broken JSON is refused with its line and column."""
    path = tmp_path / "task.json"
    path.write_text('{\n  "schemaVersion": "1.0",\n  "kind": }\n')
    with pytest.raises(ContractError, match=r"line 3 column 11"):
        load_contract(path)


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    """A key given twice in one object is ambiguous and refused."""
    path = tmp_path / "task.json"
    path.write_text('{"name": "a", "name": "b"}')
    with pytest.raises(ContractError, match="'name' appears twice"):
        load_contract(path)


def test_unknown_top_level_field_is_named(tmp_path: Path) -> None:
    """An unknown top-level field is refused with its JSON path."""
    data = _toy()
    data["surprise"] = 1
    with pytest.raises(ContractError) as err:
        load_contract(_write(tmp_path, data))
    assert err.value.path == "$.surprise"
    assert "unknown field" in str(err.value)


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("cpus", 0, "$.environment.cpus"),
        ("cpus", 100000, "$.environment.cpus"),
        ("memoryGb", -1, "$.environment.memoryGb"),
        ("timeoutMinutes", 0, "$.environment.timeoutMinutes"),
        ("pidsLimit", 1, "$.environment.pidsLimit"),
        ("cpus", "two", "$.environment.cpus"),
    ],
)
def test_out_of_range_resources_are_named(
    tmp_path: Path, field: str, value: object, path: str
) -> None:
    """Resources outside their range are refused with the field's path and the range."""
    data = _toy()
    data["environment"][field] = value
    with pytest.raises(ContractError) as err:
        load_contract(_write(tmp_path, data))
    assert err.value.path == path
    assert json.dumps(value) in str(err.value)


@pytest.mark.parametrize("evidence", ["/etc/passwd", "../escape.json", "logs/../../x.json"])
def test_escaping_evidence_path_is_refused(tmp_path: Path, evidence: str) -> None:
    """Evidence paths are relative to /job/output and may not leave it."""
    data = _toy()
    data["measurements"][0]["parser"]["evidencePath"] = evidence
    with pytest.raises(ContractError) as err:
        load_contract(_write(tmp_path, data))
    assert err.value.path == "$.measurements[0].parser.evidencePath"


def test_escaping_input_path_is_refused(tmp_path: Path) -> None:
    """A repository path with '..' is refused before anything is copied."""
    data = _toy()
    data["repository"]["path"] = "../../etc"
    with pytest.raises(ContractError) as err:
        load_contract(_write(tmp_path, data))
    assert err.value.path == "$.repository.path"


def test_missing_required_field_is_named(tmp_path: Path) -> None:
    data = _toy()
    del data["environment"]["image"]
    with pytest.raises(ContractError) as err:
        load_contract(_write(tmp_path, data))
    assert err.value.path == "$.environment.image"
    assert "required" in str(err.value)


def test_several_errors_are_all_listed(tmp_path: Path) -> None:
    data = _toy()
    data["environment"]["cpus"] = -1
    data["environment"]["shmGb"] = -1
    with pytest.raises(ContractError) as err:
        load_contract(_write(tmp_path, data))
    assert "$.environment.cpus" in str(err.value)
    assert "$.environment.shmGb" in str(err.value)


def test_unknown_parser_lists_the_available_ones(tmp_path: Path) -> None:
    data = _toy()
    data["measurements"][0]["parser"]["version"] = "9"
    with pytest.raises(ContractError) as err:
        load_contract(_write(tmp_path, data))
    assert err.value.path == "$.measurements[0].parser"
    assert "json.scalar@1" in str(err.value)


def test_bad_parser_config_names_the_config_field(tmp_path: Path) -> None:
    data = _toy()
    data["measurements"][0]["parser"]["config"]["pointer"] = 7
    with pytest.raises(ContractError) as err:
        load_contract(_write(tmp_path, data))
    assert err.value.path == "$.measurements[0].parser.config.pointer"


def test_missing_command_fragment_is_ambiguous(tmp_path: Path) -> None:
    """Every requiredCommandFragment must occur in the command that will run."""
    data = _toy()
    data["protocol"]["command"] = ["python3", "/job/input/repository/evaluate.py"]
    contract = load_contract(_write(tmp_path, data))
    with pytest.raises(ProtocolAmbiguous, match="--checkpoint"):
        plan.build(contract, HostPolicy(), job_id="j", host_uid=0, host_gid=0)


def test_contract_without_command_is_ambiguous(tmp_path: Path) -> None:
    """The seed contract leaves the command to an agent: it is agent_planned, refused on a
    host without an adapter for its runtime; a fixed_entrypoint contract without a command
    names the field."""
    with pytest.raises(PolicyViolation, match=r"\$\.agent\.runtime.*offers none"):
        plan.build(
            load_contract(SEED), HostPolicy(allowNetwork=True), job_id="j", host_uid=0, host_gid=0
        )
    data = _toy()
    del data["protocol"]["command"]
    data["protocol"]["executionMode"] = "fixed_entrypoint"
    contract = load_contract(_write(tmp_path, data))
    with pytest.raises(ProtocolAmbiguous, match=r"\$\.protocol\.command"):
        plan.build(contract, HostPolicy(), job_id="j", host_uid=0, host_gid=0)


def test_tag_only_image_is_refused(tmp_path: Path) -> None:
    """A tag pins nothing; the default policy refuses it and says how to pin."""
    data = _toy()
    data["environment"]["image"] = "runner-cpu:local"
    contract = load_contract(_write(tmp_path, data))
    with pytest.raises(PolicyViolation, match="runner pin") as err:
        plan.build(contract, HostPolicy(), job_id="j", host_uid=0, host_gid=0)
    assert "$.environment.image" in str(err.value)
    allowed = plan.build(
        contract, HostPolicy(allowUnpinnedImages=True), job_id="j", host_uid=0, host_gid=0
    )
    assert allowed.image.image_id is None


def test_tag_only_image_is_refused_by_the_cli(tmp_path: Path) -> None:
    """`runner verify` exits 3 (refused) on a tag-only contract."""
    proc = run_cli("verify", str(TOY / "task.json"), "--allow-unsigned")
    assert proc.returncode == 3, proc.stderr
    assert "policy_violation" in proc.stderr
    assert "$.environment.image" in proc.stderr


def test_network_is_refused_unless_the_host_allows_it(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from runner.planning import policy

    data = _toy()
    data["environment"]["networkAccess"] = True
    contract = load_contract(_write(tmp_path, data))
    now = datetime.now(UTC)
    with pytest.raises(PolicyViolation, match=r"\$\.environment\.networkAccess"):
        policy.check(contract, HostPolicy(acceptUnsigned=True), now)
    policy.check(contract, HostPolicy(acceptUnsigned=True, allowNetwork=True), now)


def test_plan_caps_swap_to_memory_and_runs_as_non_root(tmp_path: Path) -> None:
    contract = load_contract(_write(tmp_path, _toy()))
    p = plan.build(contract, HostPolicy(), job_id="j", host_uid=0, host_gid=0)
    assert p.limits.memory_swap_bytes == p.limits.memory_bytes == 512 * 1024**2
    assert p.user == "10001:10001"
    assert p.limits.network == "none"
    own = plan.build(contract, HostPolicy(), job_id="j", host_uid=1234, host_gid=99)
    assert own.user == "1234:99"


def test_digest_is_rfc8785_not_sorted_dumps() -> None:
    """Float formatting follows RFC 8785 (ECMAScript), which sorted json.dumps does not."""
    assert canonical_digest({"a": 1e21, "contractDigest": "x"}) == canonical_digest({"a": 1e21})
    import hashlib

    assert canonical_digest({"a": 1e21}) == "sha256:" + hashlib.sha256(b'{"a":1e+21}').hexdigest()


def test_checked_in_schemas_match_the_models() -> None:
    """contracts/*.schema.json are generated from the models and kept in step."""
    assert schemas_main(["--check"]) == 0


def test_seed_and_toy_contracts_validate_against_the_json_schema() -> None:
    schema = json.loads((CONTRACTS / "execution-contract.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for path in (SEED, TOY / "task.json"):
        errors = list(validator.iter_errors(json.loads(path.read_text())))
        assert errors == [], (path, errors[:3])
    bad = json.loads(SEED.read_text())
    bad["environment"]["cpus"] = -2
    assert list(validator.iter_errors(bad))


def test_job_id_is_checked(tmp_path: Path) -> None:
    """--job-id must be a plain id; it may not replace a signed jobId."""
    import dataclasses

    from runner.contract import SignatureInfo

    data = _toy()
    data["jobId"] = "signed-job"
    contract = load_contract(_write(tmp_path, data))
    with pytest.raises(PolicyViolation, match="is not a job id"):
        plan.job_id_for(contract, "../../escape")
    assert plan.job_id_for(contract, "other") == "other"  # unsigned: the operator decides
    signed = dataclasses.replace(contract, signature=SignatureInfo(("k",), "t", b""))
    with pytest.raises(PolicyViolation, match=r"runs under the signed .* fresh budget"):
        plan.job_id_for(signed, "other")
    assert plan.job_id_for(signed, None) == "signed-job"
    assert plan.job_id_for(signed, "signed-job") == "signed-job"
    assert plan.job_id_for(signed, "other", allow_override=True) == "other"


def test_signed_contract_without_job_id_keeps_one_budget(tmp_path: Path) -> None:
    """Hostile-review item 8: a signed contract without $.jobId (what `runner sign` writes by
    default) used to get a fresh ledger, so a fresh budget, for every --job-id. Its job id is
    now derived from its digest and another one is refused unless the policy allows it."""
    import dataclasses

    from runner.contract import SignatureInfo

    contract = load_contract(_write(tmp_path, _toy()))
    signed = dataclasses.replace(contract, signature=SignatureInfo(("k",), "t", b""))
    own = plan.job_id_for(signed, None)
    assert own.endswith(contract.digest.removeprefix("sha256:")[:12])
    assert plan.job_id_for(signed, own) == own
    for other in ("again-1", "again-2"):
        with pytest.raises(PolicyViolation, match="derived from the contract's digest"):
            plan.job_id_for(signed, other)


def test_command_line_mistakes_exit_2(tmp_path: Path) -> None:
    path = _write(tmp_path, _toy())
    for extra in (
        ["--label", "org.runner.managed=false"],
        ["--label", "novalue"],
        ["--limit", "cpus=lots"],
    ):
        proc = run_cli("run", str(path), "--state-dir", str(tmp_path / "s"), *extra)
        assert proc.returncode == 2, (extra, proc.stderr)
        assert "runner: error:" in proc.stderr
    nan = run_cli(
        "run",
        str(path),
        "--state-dir",
        str(tmp_path / "s"),
        "--json",
        "--allow-unsigned",
        "--limit",
        "cpus=nan",
    )
    assert nan.returncode == 3
    assert json.loads(nan.stdout)["failure"]["category"] == "policy_violation"


def test_broken_host_policy_still_gives_an_envelope(tmp_path: Path) -> None:
    bad = tmp_path / "policy.json"
    bad.write_text("{not json")
    proc = run_cli("run", str(_write(tmp_path, _toy())), "--json", "--policy", str(bad))
    assert proc.returncode == 4
    envelope = json.loads(proc.stdout)
    assert envelope["failure"]["category"] == "infrastructure"
    assert "host policy" in envelope["failure"]["reason"]


def test_cli_command_list_matches_the_parser() -> None:
    """main() builds only the command it is given; COMMANDS must name every command."""
    from runner import cli

    full = cli.build_parser()
    (sub,) = [a for a in full._actions if a.__class__.__name__ == "_SubParsersAction"]
    assert set(sub.choices) == cli.COMMANDS  # type: ignore[attr-defined]
    for name in cli.COMMANDS:
        (one,) = [a for a in cli.build_parser(only=name)._actions if a.dest == "command"]
        assert list(one.choices) == [name]  # type: ignore[attr-defined]


def test_cli_listing_is_the_full_parser_for_a_line_naming_no_command() -> None:
    """`runner --help` (and any line naming no command) builds only the list of commands, from
    the table in runner/cli/__init__.py: its help and its choices are the full parser's."""
    from runner import cli

    full, listing = cli.build_parser(), cli.build_parser(listing=True)
    assert listing.format_help() == full.format_help()
    assert listing.format_usage() == full.format_usage()
    (a,) = [x for x in full._actions if x.dest == "command"]
    (b,) = [x for x in listing._actions if x.dest == "command"]
    assert list(a.choices) == list(b.choices)  # type: ignore[attr-defined]


@pytest.mark.parametrize("pointer", ["/a~2", "/a~", "/~", "/ok/b~3c"])
def test_a_pointer_with_an_invalid_escape_is_refused(tmp_path: Path, pointer: str) -> None:
    """RFC 6901: '~' only as '~0' or '~1'; anything else is not a pointer."""
    data = _toy()
    data["measurements"][0]["parser"]["config"]["pointer"] = pointer
    with pytest.raises(ContractError, match="pointer"):
        load_contract(_write(tmp_path, data))


def test_escaped_pointers_are_accepted(tmp_path: Path) -> None:
    data = _toy()
    data["measurements"][0]["parser"]["config"]["pointer"] = "/a~0b/c~1d/~01"
    load_contract(_write(tmp_path, data))


def test_status_of_a_missing_job_is_job_not_found(tmp_path: Path) -> None:
    proc = run_cli("status", "no-such-job", "--state-dir", str(tmp_path))
    assert proc.returncode == 5, proc.stderr
    assert "job_not_found" in proc.stderr and "policy_violation" not in proc.stderr


def test_version_and_schema_commands() -> None:
    proc = run_cli("--version", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["distribution"] == "reproduction-runner" and info["python"]
    from runner._version import __version__

    assert info["runner"] == __version__
    proc = run_cli("schema", "execution-contract")
    assert proc.returncode == 0
    assert proc.stdout == (CONTRACTS / "execution-contract.schema.json").read_text()
    assert run_cli("schema", "nope").returncode == 2
