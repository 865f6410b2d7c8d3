"""Hypothesis-generated contracts, valid and mutated, through `runner verify`: each is accepted
(exit 0) or refused with a clean `runner: <category>: ...` line (exit 2, 3 or 4), never a
traceback and never exit 1."""

from __future__ import annotations

import contextlib
import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from runner.client import main
from runner.contract import with_digest
from runner.core.errors import ContractError
from tests.support import TOY, run_cli

pytestmark = pytest.mark.slow  # hypothesis examples, each one a verify run

IMAGE_ID = "sha256:" + "ab" * 32
CLEAN_EXITS = {0, 2, 3, 4}
CATEGORY_LINE = re.compile(r"^runner: [a-z_]+: ", re.MULTILINE)

Path_ = tuple[str | int, ...]


def _base() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((TOY / "task.json").read_text())
    data["environment"]["image"] = IMAGE_ID
    return with_digest(data)


BASE = _base()


def _paths(value: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every JSON path inside ``value`` (objects and arrays included), root excluded."""
    out: list[Path_] = []
    items: list[tuple[str | int, Any]] = []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    for key, child in items:
        out.append((*prefix, key))
        out.extend(_paths(child, (*prefix, key)))
    return out


PATHS = _paths(BASE)


def _node(path: Path_) -> Any:
    node: Any = BASE
    for key in path:
        node = node[key]
    return node


DICT_PATHS: list[Path_] = [(), *(p for p in PATHS if isinstance(_node(p), dict))]

TRICKY_TEXT = [
    "",
    " ",
    "../x",
    "../../etc",
    "/etc/passwd",
    "logs/../../x.json",
    "./",
    ".",
    "..",
    "~/.ssh/id_rsa",
    "C:\\Windows\\x",
    "a\x00b",
    "\ud800",
    "\u202egnp.exe",
    "é" * 50,
    "x" * 5000,
    "NaN",
    "sha256:" + "ab" * 32,
    "sha256:" + "AB" * 32,
    "runner-cpu:local",
    "1970-01-01T00:00:00Z",
    "9999-12-31T23:59:59+00:00",
    "json.scalar",
    "/accuracy",
    "all",
    "none",
    "--checkpoint",
]
TRICKY_NUMBERS = [
    0,
    -1,
    1,
    2**31,
    2**63,
    -(2**63),
    10**40,
    -(10**40),
    0.0,
    -0.0,
    1e-320,
    1e308,
    -1e308,
    0.0625,
    float("nan"),
    float("inf"),
    float("-inf"),
]

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(TRICKY_NUMBERS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(TRICKY_TEXT),
)
json_values = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.sampled_from(TRICKY_TEXT), children, max_size=4)
    ),
    max_leaves=12,
)
unknown_keys = st.text(min_size=1, max_size=12) | st.sampled_from(
    ["surprise", "payload", "payloadType", "signatures", "contractDigest", "__proto__", "$ref"]
)

numbers = st.one_of(
    st.sampled_from(TRICKY_NUMBERS),
    st.integers(-10, 100_000),
    st.floats(min_value=-1e6, max_value=1e6),
    st.floats(allow_nan=True, allow_infinity=True),
)


def _like(original: Any) -> st.SearchStrategy[Any]:
    """Values of the original's JSON type, so that more mutants pass the schema and reach the
    policy and the plan."""
    if isinstance(original, bool):
        return st.booleans()
    if isinstance(original, int | float):
        return numbers
    if isinstance(original, str):
        return st.sampled_from(TRICKY_TEXT) | st.text(max_size=20)
    if isinstance(original, list):
        return st.lists(st.sampled_from(TRICKY_TEXT), max_size=3)
    return json_values


@st.composite
def _set_like(draw: st.DrawFn) -> tuple[Any, ...]:
    path = draw(st.sampled_from(PATHS))
    return ("set", path, draw(_like(_node(path))))


DATES = [
    "2000-01-01T00:00:00Z",
    "2999-01-01T00:00:00+00:00",
    "2024-02-30T00:00:00Z",
    "0001-01-01T00:00:00+14:00",
    "9999-12-31T23:59:59-14:00",
    "2024-01-01T00:00:00",
    "now",
]
EDGE_NUMBERS = [1e-9, 0.0001, 1, 2, 3, 16, 15, 64, 65, 512, 513, 4096, 43200, 65536, 1_000_000]
# Fields the runner knows, top level and in environment/protocol/computeRequirement, with
# values near their bounds: mutants that pass the schema and meet the policy and the plan.
KNOWN_FIELDS: list[tuple[Path_, str, st.SearchStrategy[Any]]] = [
    ((), "jobId", st.sampled_from(["a", "../x", "A" * 128, "A" * 129, "-x", "x.y_z-1"])),
    ((), "issuedAt", st.sampled_from(DATES)),
    ((), "expiresAt", st.sampled_from(DATES)),
    ((), "audience", st.lists(st.sampled_from(["", "lab-a", "*", "../x"]), max_size=3)),
    (("environment",), "imageId", st.sampled_from(["sha256:" + "ab" * 32, "sha256:" + "0" * 63])),
    (
        ("environment",),
        "image",
        st.sampled_from(
            [
                "python:3",
                "runner-cpu:local",
                "docker.io/library/python@sha256:" + "ab" * 32,
                "evil.example:5000/x@sha256:" + "cd" * 32,
                "sha256:" + "AB" * 32,
                "@sha256:" + "ab" * 32,
            ]
        ),
    ),
    (("environment",), "isolation", st.sampled_from(["runc", "runsc", "kata"])),
    (("environment",), "gpu", st.sampled_from(["all", "none", 1, 64, 65, 0, True])),
    (("environment",), "networkAccess", st.booleans()),
    *(
        (("environment",), name, st.sampled_from(EDGE_NUMBERS))
        for name in (
            "cpus",
            "memoryGb",
            "shmGb",
            "timeoutMinutes",
            "pidsLimit",
            "tmpfsMb",
            "diskGb",
            "logLimitMb",
        )
    ),
    (
        ("protocol",),
        "workingDirectory",
        st.sampled_from(["/", "/job/../etc", "/tmp", "relative", "/job/output"]),
    ),
    (
        ("protocol",),
        "stderrPath",
        st.sampled_from(["logs/evaluation.log", "logs/./evaluation.log"]),
    ),
    (("protocol",), "command", st.lists(st.sampled_from(TRICKY_TEXT), max_size=3)),
    (("computeRequirement",), "cpuFallbackAllowed", st.booleans()),
    (("computeRequirement",), "gpuCount", st.sampled_from([0, 1, 8, -1])),
]
known_field = st.sampled_from(KNOWN_FIELDS).flatmap(
    lambda f: st.tuples(st.just("add"), st.just(f[0]), st.just(f[1]), f[2])
)

mutation = st.one_of(
    known_field,
    known_field,
    st.tuples(st.just("drop"), st.sampled_from(PATHS)),
    st.tuples(st.just("set"), st.sampled_from(PATHS), json_values),
    _set_like(),
    _set_like(),
    st.tuples(st.just("add"), st.sampled_from(DICT_PATHS), unknown_keys, json_values),
)

# Number and nesting literals written straight into the text (json.dumps would not produce
# them). They stay inside what Python's json module parses; see the two tests at the end for the
# ones past its limits.
LITERALS = [
    "1" * 4000,
    "-" + "9" * 4000,
    "1e999",
    "-1e999",
    "1.0e-400",
    "-0",
    "1E+2",
    "NaN",
    "-Infinity",
    "[" * 50 + "]" * 50,
    '{"a":' * 50 + "1" + "}" * 50,
    '"\\ud800"',
    '"\\u0000"',
]
BAD_BYTES = [
    b"\xff",
    b"\xc3\x28",
    b"\xed\xa0\x80",
    b"\xf8\x88\x80\x80\x80",
    b"\x80",
    b"\xef\xbb\xbf",
]

raw_ops = st.lists(
    st.one_of(
        st.tuples(st.just("dup"), st.sampled_from(DICT_PATHS), st.integers(0, 30), json_values),
        st.tuples(st.just("literal"), st.sampled_from(PATHS), st.sampled_from(LITERALS)),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("bytes"), st.floats(0, 1), st.sampled_from(BAD_BYTES)),
    ),
    max_size=2,
)


def _apply(data: dict[str, Any], op: tuple[Any, ...]) -> None:
    """Apply one structured mutation; a path that earlier mutations removed is skipped."""
    kind, path = op[0], op[1]
    parent: Any = data
    target = path if kind == "add" else path[:-1]
    for key in target:
        try:
            parent = parent[key]
        except (KeyError, IndexError, TypeError):
            return
    if kind == "add":
        if isinstance(parent, dict):
            parent[op[2]] = op[3]
        return
    last = path[-1]
    in_dict = isinstance(parent, dict) and isinstance(last, str) and last in parent
    in_list = isinstance(parent, list) and isinstance(last, int) and last < len(parent)
    if not (in_dict or in_list):
        return
    if kind == "drop":
        del parent[last]
    else:
        parent[last] = op[2]


def _dump(value: Any, ascii_only: bool, raw: list[tuple[Any, ...]], path: Path_ = ()) -> str:
    """JSON text of ``value``, with the raw-text edits (duplicate keys, literals) at their paths."""
    for op in raw:
        if op[0] == "literal" and op[1] == path:
            return str(op[2])
    if isinstance(value, dict):
        parts = []
        for op in raw:
            if op[0] == "dup" and op[1] == path and value:
                key = list(value)[op[2] % len(value)]
                parts.append(f"{json.dumps(key)}: {json.dumps(op[3])}")
        for key, child in value.items():
            parts.append(
                f"{json.dumps(key, ensure_ascii=ascii_only)}: "
                f"{_dump(child, ascii_only, raw, (*path, key))}"
            )
        return "{" + ", ".join(parts) + "}"
    if isinstance(value, list):
        return (
            "["
            + ", ".join(_dump(child, ascii_only, raw, (*path, i)) for i, child in enumerate(value))
            + "]"
        )
    return json.dumps(value, ensure_ascii=ascii_only)


@st.composite
def contracts(draw: st.DrawFn) -> bytes:
    """The toy contract's bytes after Hypothesis-chosen mutations."""
    data = copy.deepcopy(BASE)
    for op in draw(st.lists(mutation, max_size=4)):
        _apply(data, op)
    if draw(st.integers(0, 3)):  # three times in four, re-digest
        # NaN and friends cannot be canonicalized: then the old digest stays.
        with contextlib.suppress(ContractError):
            data = with_digest(data)
    raw = draw(raw_ops) if draw(st.integers(0, 3)) == 0 else []  # raw edits one time in four
    text = _dump(data, draw(st.booleans()), raw)
    out = text.encode("utf-8", errors="surrogatepass")
    for op in raw:
        if op[0] == "truncate":
            out = out[: int(len(out) * op[1])]
        elif op[0] == "bytes":
            at = int(len(out) * op[1])
            out = out[:at] + op[2] + out[at:]
    return out


def _check(code: int | str | None, stdout: str, stderr: str, as_json: bool) -> None:
    category = CATEGORY_LINE.search(stderr)
    event(f"exit {code} {category.group(0).strip() if category else ''}")
    assert code in CLEAN_EXITS, (code, stderr)
    assert "Traceback" not in stderr, stderr
    assert "internal error" not in stderr, stderr
    if code == 0:
        assert stderr == "" or not CATEGORY_LINE.search(stderr), stderr
    elif code != 2:
        assert CATEGORY_LINE.search(stderr), stderr
    else:
        assert stderr.startswith(("runner: error:", "usage:")), stderr
    if as_json and code in (0, 3, 4):
        assert isinstance(json.loads(stdout)["valid"], bool), stdout


@settings(
    max_examples=700,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(raw=contracts(), as_json=st.booleans())
def test_verify_in_process_never_crashes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], raw: bytes, as_json: bool
) -> None:
    """In-process `runner verify` of a mutated contract exits 0/2/3/4 cleanly, never crashes."""
    path = tmp_path / "task.json"
    path.write_bytes(raw)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["verify", str(path), "--allow-unsigned", *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    _check(exit_info.value.code, out, err, as_json)


@settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(raw=contracts())
def test_verify_subprocess_never_tracebacks(tmp_path: Path, raw: bytes) -> None:
    """`python -m runner verify` of a mutated contract never prints a traceback or exits 1."""
    path = tmp_path / "task.json"
    path.write_bytes(raw)
    proc = run_cli("verify", str(path), "--allow-unsigned", timeout=60)
    _check(proc.returncode, proc.stdout, proc.stderr, as_json=False)


def test_unmutated_base_contract_verifies(tmp_path: Path) -> None:
    """The fuzzers' starting point (the toy contract, pinned to a digest) is accepted."""
    path = tmp_path / "task.json"
    path.write_text(json.dumps(BASE))
    proc = run_cli("verify", str(path), "--allow-unsigned", timeout=60)
    assert proc.returncode == 0, proc.stderr


def _with_literal(literal: str) -> bytes:
    return _dump(BASE, True, [("literal", ("environment", "cpus"), literal)]).encode()


def test_number_over_python_digit_limit_is_a_clean_refusal(tmp_path: Path) -> None:
    """A 5000-digit integer in the contract is refused as invalid_contract, not a traceback."""
    path = tmp_path / "task.json"
    path.write_bytes(_with_literal("1" * 5000))
    proc = run_cli("verify", str(path), "--allow-unsigned", timeout=60)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert "runner: invalid_contract:" in proc.stderr


def test_deeply_nested_value_is_a_clean_refusal(tmp_path: Path) -> None:
    """An array nested 100000 deep is refused as invalid_contract, not a traceback."""
    path = tmp_path / "task.json"
    path.write_bytes(_with_literal("[" * 100_000 + "]" * 100_000))
    proc = run_cli("verify", str(path), "--allow-unsigned", timeout=60)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert "runner: invalid_contract:" in proc.stderr
