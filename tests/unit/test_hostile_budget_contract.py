"""Regression tests for issue 25, items 11 and 13: the budget's bound when the runner is
killed again and again on a loaded machine (real engine), and JSON nested deep enough to
crash what reads it (a contract, its signed envelope, a signed result, a bundle).

The tests that need the engine are in tests/integration/test_hostile_budget_contract.py.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.core import jsondepth
from runner.core.errors import ImageUnavailable
from runner.trust import signing
from tests.support import run_cli, write_contract

NO_IMAGE = "sha256:" + "0" * 64
"""Verifying a contract needs no image: any pinned digest will do."""


def _deep(kind: str, depth: int) -> str:
    """JSON text ``depth`` levels deep: objects (``{"a": ...}``) or arrays."""
    if kind == "object":
        return '{"a":' * depth + "1" + "}" * depth
    return "[" * depth + "]" * depth


def _contract_text(tmp_path: Path, put: str) -> str:
    """The toy contract with ``put`` spliced in as the JSON text of one value: "parser"
    (measurements[0].parser.config.x), "title" (a string field) or "top" (the document)."""
    mark = "@@DEEP@@"

    def change(data: dict[str, Any]) -> None:
        if put == "parser":
            data["measurements"][0]["parser"]["config"]["x"] = mark
        elif put == "title":
            data["title"] = mark

    return write_contract(tmp_path, NO_IMAGE, command=["true"], change=change).read_text()


WHERE = {
    "parser": "$.measurements[0].parser.config.x",
    "title": "$.title",
    "top": "$",
}


def _no_traceback(proc: Any) -> None:
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr


@pytest.mark.hostile
@pytest.mark.parametrize("depth", [300, 100_000])
@pytest.mark.parametrize("kind", ["object", "array"])
@pytest.mark.parametrize("put", ["parser", "title", "top"])
def test_deeply_nested_contract_is_invalid_contract(
    tmp_path: Path, put: str, kind: str, depth: int
) -> None:
    """A parser config 300 levels deep made the JSON Schema validator raise (exit 4 with a
    traceback); 100000 levels made json.loads raise. Either, anywhere in the contract, is
    invalid_contract naming the JSON path of the first spot too deep."""
    deep = _deep(kind, depth)
    text = deep if put == "top" else _contract_text(tmp_path, put).replace('"@@DEEP@@"', deep)
    path = tmp_path / "deep.json"
    path.write_text(text)
    proc = run_cli("verify", str(path), "--allow-unsigned", timeout=120)
    _no_traceback(proc)
    assert proc.returncode == 3, proc.stderr
    assert "invalid_contract" in proc.stderr
    assert "more than 64 levels deep" in proc.stderr
    assert WHERE[put] in proc.stderr, proc.stderr


@pytest.mark.hostile
def test_contract_within_the_cap_still_verifies_its_parser_config(tmp_path: Path) -> None:
    """64 levels is allowed: the schema validator then answers for the config (here: an
    unknown field), with no crash."""
    text = _contract_text(tmp_path, "parser")
    # The parser config sits 5 levels deep ($, measurements, [0], parser, config).
    x: Any = 1
    for _ in range(59):
        x = {"a": x}
    data = json.loads(text.replace('"@@DEEP@@"', json.dumps(x)))
    data.pop("contractDigest")
    from runner.contract import with_digest

    path = tmp_path / "deep.json"
    path.write_text(json.dumps(with_digest(data)))
    assert jsondepth.too_deep(path.read_text(), 64) is None
    proc = run_cli("verify", str(path), "--allow-unsigned", timeout=120)
    _no_traceback(proc)
    assert proc.returncode == 3, proc.stderr
    assert "$.measurements[0].parser.config" in proc.stderr
    assert "'x' was unexpected" in proc.stderr


@pytest.mark.hostile
@pytest.mark.parametrize("depth", [300, 100_000])
def test_signed_contract_with_a_deep_payload(tmp_path: Path, depth: int) -> None:
    """A DSSE envelope (task.dsse.json) whose signed payload nests too deep: the payload goes
    through the same load, and is refused the same way."""
    assert run_cli("keygen", "--out", str(tmp_path / "issuer")).returncode == 0
    keys = tmp_path / "trusted"
    trusted = run_cli("trust", str(tmp_path / "issuer.pub"), "--trusted-keys", str(keys))
    assert trusted.returncode == 0, trusted.stderr
    payload = _contract_text(tmp_path, "parser").replace('"@@DEEP@@"', _deep("array", depth))
    envelope = signing.sign(payload.encode(), signing.load_private_key(tmp_path / "issuer.key"))
    path = tmp_path / "task.dsse.json"
    path.write_text(signing.dumps_envelope(envelope))
    proc = run_cli("verify", str(path), "--trusted-keys", str(keys), timeout=120)
    _no_traceback(proc)
    assert proc.returncode == 3, proc.stderr
    assert "invalid_contract" in proc.stderr and "(signed payload)" in proc.stderr
    assert WHERE["parser"] in proc.stderr


@pytest.mark.hostile
def test_deep_host_policy_is_refused(tmp_path: Path) -> None:
    """A host policy file goes through the contract's parse, and its cap."""
    policy = tmp_path / "policy.json"
    policy.write_text('{"schemaVersion": "1.0", "x": ' + _deep("array", 100_000) + "}")
    contract = tmp_path / "c"
    contract.mkdir()
    path = write_contract(contract, NO_IMAGE, command=["true"])
    proc = run_cli("verify", str(path), "--allow-unsigned", "--policy", str(policy), timeout=120)
    _no_traceback(proc)
    assert proc.returncode == 4, proc.stderr  # the host's own file: infrastructure
    assert "more than 64 levels deep" in proc.stderr and "$.x" in proc.stderr


@pytest.mark.hostile
def test_deep_signed_result_is_refused(tmp_path: Path) -> None:
    """`runner verify-result` of a file nested 100000 deep raised RecursionError (exit 4,
    traceback); now signature_invalid naming where."""
    path = tmp_path / "result.intoto.json"
    path.write_text(_deep("array", 100_000))
    proc = run_cli("verify-result", str(path), "--result-keys", str(tmp_path), timeout=120)
    _no_traceback(proc)
    assert proc.returncode == 3, proc.stderr
    assert "more than 128 levels deep at $[0][0]" in proc.stderr

    # A DSSE envelope whose (unverified) payload is the deep part.
    payload = base64.b64encode(_deep("object", 100_000).encode()).decode()
    path.write_text(json.dumps({"payloadType": "x", "payload": payload, "signatures": []}))
    proc = run_cli("verify-result", str(path), "--result-keys", str(tmp_path), timeout=120)
    _no_traceback(proc)
    assert proc.returncode == 3, proc.stderr


@pytest.mark.hostile
def test_deep_bundle_metadata_is_refused(tmp_path: Path) -> None:
    """A bundle whose seal and info file nest 100000 deep: `runner verify-bundle` raised
    RecursionError (exit 4, traceback); now it does not verify (exit 3), naming the file."""
    top = tmp_path / "b"
    (top / "data").mkdir(parents=True)
    deep = _deep("array", 100_000)
    (top / "runner-bundle.json").write_text(deep)
    (top / "bundle.intoto.json").write_text(deep)
    (top / "bagit.txt").write_text("BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n")
    (top / "data" / "x").write_text("x")
    (top / "bag-info.txt").write_text("Payload-Oxum: 1.1\n")  # so unpacking is reached
    archive = tmp_path / "deep.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(top, arcname="b")
    proc = run_cli("verify-bundle", str(archive), timeout=120)
    _no_traceback(proc)
    assert proc.returncode == 3, proc.stderr
    out = proc.stdout + proc.stderr
    assert "bundle.intoto.json" in out and "more than 128 levels deep" in out, out


def test_too_deep_names_the_first_spot() -> None:
    """The scan: strings' brackets are not structure, keys and indexes make the path, text
    that is not JSON is left to the parser, and it needs no recursion at any depth."""
    assert jsondepth.too_deep('{"a": "[[[[[[", "b": [1, {"c": []}]}', 4) is None
    assert jsondepth.too_deep('{"a": "[[[[[[", "b": [1, {"c": []}]}', 3) == "$.b[1].c"
    assert jsondepth.too_deep('{"a": 1, "b": [1, {"c": [[]]}]}', 4) == "$.b[1].c[0]"
    assert jsondepth.too_deep('{"a b": {"\\"k": [[]]}}', 3) == '$["a b"]["\\"k"][0]'
    assert jsondepth.too_deep('{"a": "[[[[', 1) is None  # a string that never ends
    assert jsondepth.too_deep("[" * 1_000_000, 64) == "$" + "[0]" * 8 + "...(52 levels)..." + (
        "[0]" * 4
    )
    with pytest.raises(jsondepth.TooDeep) as caught:
        jsondepth.loads(b"[" * 200 + b"]" * 200)
    assert isinstance(caught.value, ValueError) and caught.value.cap == jsondepth.MAX_DEPTH
    assert jsondepth.loads("[[1]]") == [[1]]


def _depth(value: Any) -> int:
    todo, deepest = [(value, 1)], 0
    while todo:
        node, level = todo.pop()
        if isinstance(node, list | dict):
            deepest = max(deepest, level)
            todo.extend((v, level + 1) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


_BRACKETY = st.sampled_from('"\\[]{}a')
_VALUES = st.recursive(
    st.none() | st.integers() | st.text(_BRACKETY),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(_BRACKETY), inner),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(value=_VALUES, cap=st.integers(min_value=1, max_value=12))
def test_depth_check_agrees_with_the_value(value: Any, cap: int) -> None:
    """The C-speed check and the token scan against the parsed value's own depth, with
    brackets, quotes and backslashes in strings and keys."""
    text = json.dumps(value)
    within = _depth(value) <= cap
    assert jsondepth._within(text, cap) == within
    assert (jsondepth.too_deep(text, cap) is None) == within


@pytest.mark.hostile
def test_deep_image_bundle_manifest_and_input_listing(tmp_path: Path) -> None:
    """Two more readers of JSON from outside that raised RecursionError at 100000 levels: a
    `docker save` bundle's manifest.json (an image bundle) and the input listings file beside
    a contract. Each is now the refusal its reader gives any unreadable file."""
    from runner.images import pins as images
    from runner.staging import inputs

    deep = _deep("array", 100_000).encode()
    bundle = tmp_path / "image.tar"
    with tarfile.open(bundle, "w") as tar:
        member = tarfile.TarInfo("manifest.json")
        member.size = len(deep)
        tar.addfile(member, io.BytesIO(deep))
    with pytest.raises(ImageUnavailable, match="more than 128 levels deep"):
        images.bundle_image_ids(bundle)

    (tmp_path / inputs.listings_name("task.json")).write_bytes(deep)
    with pytest.raises(ValueError, match="has no"):
        inputs.read_listing(tmp_path, "task.json", "repository", "sha256:" + "0" * 64)


@pytest.mark.hostile
def test_deep_ledger_line_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    """`runner verify-bundle` and `runner ledger verify` read a bundle's or a job's ledger
    line by line; a line nested 100000 deep raised RecursionError. It is a broken line."""
    from runner.state import ledger

    path = tmp_path / "ledger.jsonl"
    path.write_bytes(_deep("object", 100_000).encode() + b"\n")
    (problem,) = ledger.verify_file(path)
    assert problem.line == 1 and "more than 128 levels deep" in problem.message
