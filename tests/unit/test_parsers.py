"""The parser registry and catalog, json.scalar and agent.result: pure logic over files."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest

from runner.core.errors import ContractError, EvidenceParseError
from runner.parsers import registry
from runner.parsers.json_scalar import resolve_pointer
from tests.support import ROOT

FIXTURES = Path(__file__).parents[1] / "fixtures" / "parsers"
PARSER = registry.get("json.scalar", "1")
AGENT = registry.get("agent.result", "1")
SHIPPED = [
    ("agent.result", "1"),
    ("csv.cell", "1"),
    ("json.scalar", "1"),
    ("jsonl.scalar", "1"),
    ("junit.summary", "1"),
    ("regex.scalar", "1"),
]


def _parse(tmp_path: Path, text: str, pointer: str, **config: Any) -> object:
    path = tmp_path / "evidence.json"
    path.write_text(text)
    return PARSER.parse(path, {"pointer": pointer, **config})


def _binding(parser_id: str, config: dict[str, Any]) -> SimpleNamespace:
    return SimpleNamespace(id=parser_id, version="1", config=config)


# --- registry and catalog -------------------------------------------------------------------


def test_every_parser_is_registered_at_version_1() -> None:
    """The six shipped parsers are registered, each as version 1."""
    assert registry.available() == SHIPPED


def test_catalog_is_sorted_json_ready_and_complete() -> None:
    """catalog() lists id, version, description and configSchema for each parser, sorted."""
    items = registry.catalog()
    assert [(i["id"], i["version"]) for i in items] == SHIPPED
    assert json.loads(json.dumps(items)) == items
    for item in items:
        assert set(item) == {"id", "version", "description", "configSchema"}
        assert item["description"]
        jsonschema.Draft202012Validator.check_schema(item["configSchema"])


def test_catalog_is_a_copy() -> None:
    """Changing the catalog's data does not change a registered parser's schema."""
    items = registry.catalog()
    items[0]["configSchema"]["properties"].clear()
    assert registry.catalog()[0]["configSchema"]["properties"]


def _walk(schema: Any) -> list[dict[str, Any]]:
    """Every subschema that declares fields (not the ones that only constrain them)."""
    found: list[dict[str, Any]] = []
    if isinstance(schema, dict):
        if "properties" in schema:
            found.append(schema)
        for key, value in schema.items():
            if key not in ("if", "then", "else", "dependentSchemas"):
                found.extend(_walk(value))
    elif isinstance(schema, list):
        for value in schema:
            found.extend(_walk(value))
    return found


@pytest.mark.parametrize(("parser_id", "version"), SHIPPED)
def test_config_schemas_are_closed_and_described(parser_id: str, version: str) -> None:
    """Every config schema is draft 2020-12, closed, and describes every field."""
    schema = registry.get(parser_id, version).config_schema
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] is False
    for obj in _walk(schema):
        for field, sub in obj["properties"].items():
            assert sub.get("description"), f"{parser_id}: {field} has no description"
        if obj is not schema and obj.get("type") == "object":
            assert obj["additionalProperties"] is False


def test_registry_refuses_a_second_registration() -> None:
    """Registering the same (id, version) twice is an error."""
    with pytest.raises(ValueError, match="already registered"):
        registry.register(PARSER)


def test_binding_schema_errors_name_the_field() -> None:
    """A config its schema rejects refuses the contract, naming the field."""
    with pytest.raises(ContractError, match=r"\$\.m\.config\.select"):
        registry.check_binding(
            _binding("jsonl.scalar", {"pointer": "/a", "select": "x"}), path="$.m"
        )
    with pytest.raises(ContractError, match=r'\$\.m\.config\.select: "match" was expected'):
        registry.check_binding(
            _binding("jsonl.scalar", {"pointer": "/a", "select": "last", "occurrence": "only"}),
            path="$.m",
        )
    with pytest.raises(ContractError, match=r'\$\.m\.config: "match" is a required property'):
        registry.check_binding(
            _binding("jsonl.scalar", {"pointer": "/a", "select": "match"}), path="$.m"
        )


def test_binding_with_an_invalid_regex_is_refused_before_the_job_runs() -> None:
    """An invalid pattern, or a group the pattern lacks, refuses the contract at load time."""
    with pytest.raises(ContractError, match=r"config\.pattern.*not a valid Python regular"):
        registry.check_binding(_binding("regex.scalar", {"pattern": "acc=(\\d+"}), path="$.m")
    with pytest.raises(ContractError, match=r"config\.group.*group 2 does not exist"):
        registry.check_binding(
            _binding("regex.scalar", {"pattern": "acc=(\\d+)", "group": 2}), path="$.m"
        )
    with pytest.raises(ContractError, match=r"config\.group.*'acc' is not named"):
        registry.check_binding(
            _binding("regex.scalar", {"pattern": "acc=(\\d+)", "group": "acc"}), path="$.m"
        )
    registry.check_binding(
        _binding("regex.scalar", {"pattern": "(?P<acc>\\d+)", "group": "acc"}), path="$.m"
    )


# --- json.scalar ----------------------------------------------------------------------------


def test_reads_a_number_by_pointer(tmp_path: Path) -> None:
    """The value at the pointer is returned, an int as int and a fraction as float."""
    assert _parse(tmp_path, '{"accuracy": 0.819, "n": 1000}', "/accuracy") == 0.819
    assert _parse(tmp_path, '{"accuracy": 0.819, "n": 1000}', "/n") == 1000
    assert type(_parse(tmp_path, '{"accuracy": 0.819, "n": 1000}', "/n")) is int
    assert _parse(tmp_path, '{"a": {"b/c": [1, 2.5]}}', "/a/b~1c/1") == 2.5
    assert _parse(tmp_path, "[[1], [2, [3, 4]]]", "/1/1/1") == 4
    assert _parse(tmp_path, "7", "") == 7


def test_streamed_pointer_handles_escapes_and_off_path_subtrees(tmp_path: Path) -> None:
    """RFC 6901 escapes work in the stream, and deep subtrees off the path are skipped."""
    doc = {"skip": [{"a~b": [1, {"x/y": 2}]}] * 3, "a~b": {"x/y": [10, {"k": [20, 30]}]}}
    assert _parse(tmp_path, json.dumps(doc), "/a~0b/x~1y/1/k/1") == 30
    assert _parse(tmp_path, json.dumps(doc), "/a~0b/x~1y/0") == 10


def test_type_selects_other_json_types(tmp_path: Path) -> None:
    """`type` asks for an integer, a string or a boolean instead of a number, unconverted."""
    doc = '{"n": 3, "f": 3.0, "s": "ok", "b": false}'
    assert _parse(tmp_path, doc, "/n", type="integer") == 3
    assert _parse(tmp_path, doc, "/s", type="string") == "ok"
    assert _parse(tmp_path, doc, "/b", type="boolean") is False
    with pytest.raises(EvidenceParseError, match="expected an integer"):
        _parse(tmp_path, doc, "/f", type="integer")
    with pytest.raises(EvidenceParseError, match="expected a non-empty string"):
        _parse(tmp_path, doc, "/n", type="string")


def test_rfc6901_escapes_and_array_indices() -> None:
    """resolve_pointer unescapes ~0 and ~1 and refuses array indices with leading zeros."""
    doc = {"a~b": {"x/y": [10, 20]}}
    assert resolve_pointer(doc, "/a~0b/x~1y/0") == 10
    with pytest.raises(KeyError):
        resolve_pointer([1, 2], "/01")
    with pytest.raises(KeyError):
        resolve_pointer([1, 2], "/-")


@pytest.mark.parametrize(
    ("text", "pointer", "message"),
    [
        ("accuracy=0.8", "/accuracy", "not one JSON document"),
        ('{"accuracy": "0.8"}', "/accuracy", r'found "0\.8" \(a string\), expected a number'),
        ('{"accuracy": true}', "/accuracy", r"found true \(a boolean\), expected a number"),
        ('{"accuracy": null}', "/accuracy", r"found null \(null\), expected a number"),
        ('{"accuracy": NaN}', "/accuracy", "not one JSON document: lexical error"),
        ('{"accuracy": Infinity}', "/accuracy", "not one JSON document"),
        ('{"accuracy": 1e999}', "/accuracy", "not a finite number"),
        ('{"accuracy": [0.8]}', "/accuracy", "found an array, expected a single value"),
        ('{"other": 1}', "/accuracy", "the document is an object without key 'accuracy'"),
        ('{"a": {"b": 1}}', "/a/c", "'/a' is an object without key 'c'"),
        ('{"a": [1, 2]}', "/a/2", "'/a' is an array without element '2'"),
        ('{"a": 5}', "/a/b", "'/a' is a number, which has no 'b'"),
        ('{"accuracy": 0.8, "accuracy": 0.9}', "/accuracy", "given twice in the root object"),
        ('{"a": {"x": 1}, "a": {"b": 2}}', "/a/b", "'a' is given twice"),
        ('{"accuracy": 0.8} {"accuracy": 0.9}', "/accuracy", "trailing garbage"),
        ('{"accuracy": 0.8', "/accuracy", "premature EOF"),
        ("", "/accuracy", "not one JSON document"),
    ],
)
def test_refuses_to_guess(tmp_path: Path, text: str, pointer: str, message: str) -> None:
    """Anything but one finite number at the pointer is a parse_error, never a guess."""
    with pytest.raises(EvidenceParseError, match=message) as info:
        _parse(tmp_path, text, pointer)
    assert "evidence.json" in str(info.value)


def test_reads_the_whole_document_even_after_the_value(tmp_path: Path) -> None:
    """A document broken after the value is still refused: the file must be valid JSON."""
    with pytest.raises(EvidenceParseError, match="not one JSON document"):
        _parse(tmp_path, '{"accuracy": 0.8, "rest": [1, 2', "/accuracy")


def test_a_duplicate_key_off_the_path_does_not_matter(tmp_path: Path) -> None:
    """A key given twice elsewhere in the document does not stop the read."""
    assert _parse(tmp_path, '{"x": 1, "x": 2, "accuracy": 0.8}', "/accuracy") == 0.8


def test_utf8_bom_and_non_utf8(tmp_path: Path) -> None:
    """A UTF-8 byte order mark is skipped; bytes that are not UTF-8 are refused."""
    path = tmp_path / "evidence.json"
    path.write_bytes(b'\xef\xbb\xbf{"accuracy": 0.5}')
    assert PARSER.parse(path, {"pointer": "/accuracy"}) == 0.5
    path.write_bytes(b'{"name": "\xff", "accuracy": 0.5}')
    with pytest.raises(EvidenceParseError, match="not one JSON document"):
        PARSER.parse(path, {"pointer": "/accuracy"})


# --- agent.result ---------------------------------------------------------------------------


def test_agent_result_reads_the_status_by_default() -> None:
    """With no config, agent.result returns the agent's status string."""
    assert AGENT.parse(FIXTURES / "agent-result.json", {}) == "partial"


def test_agent_result_reads_other_fields_by_pointer() -> None:
    """A pointer and a type read any single value of the result file."""
    path = FIXTURES / "agent-result.json"
    assert AGENT.parse(path, {"pointer": "/evidence/1/path"}) == "reports/junit.xml"
    assert AGENT.parse(path, {"pointer": "/limitations/0"}).startswith("ablation")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("doc", "config", "message"),
    [
        ({"status": "completed"}, {}, "not an agent result: expected a string schemaVersion"),
        ({"schemaVersion": 2, "status": "completed"}, {}, "found 2"),
        ({"schemaVersion": "1.0", "status": "completed"}, {}, "schemaVersion '1.0'"),
        ({"schemaVersion": "2.0", "status": "done"}, {}, "expected one of completed"),
        ({"schemaVersion": "2.0"}, {}, "without key 'status'"),
        (
            {"schemaVersion": "2.0", "status": "failed", "limitations": []},
            {"pointer": "/limitations"},
            "found an array",
        ),
        ({"schemaVersion": "2.0", "status": "failed"}, {"type": "number"}, "expected a number"),
    ],
)
def test_agent_result_refusals(
    tmp_path: Path, doc: dict[str, Any], config: dict[str, Any], message: str
) -> None:
    """A file that is not a 2.x agent result, or holds no valid value there, is refused."""
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(EvidenceParseError, match=message):
        AGENT.parse(path, config)


def test_third_party_parsers_register_through_entry_points(tmp_path: Path) -> None:
    """A package declaring a `runner.parsers` entry point shows up in `runner parsers`; a
    broken one is reported, not silently dropped."""
    import json
    import os
    import subprocess
    import sys

    site = tmp_path / "site"
    (site / "lab_parsers-0.1.dist-info").mkdir(parents=True)
    (site / "lab_parsers.py").write_text(
        "class Const:\n"
        "    id = 'lab.const'\n"
        "    version = '3'\n"
        "    description = 'always 42'\n"
        "    config_schema = {'type': 'object', 'additionalProperties': False}\n"
        "    def parse(self, evidence, config):\n"
        "        return 42\n"
    )
    info = site / "lab_parsers-0.1.dist-info"
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lab-parsers\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[runner.parsers]\nconst = lab_parsers:Const\nbroken = lab_parsers:Missing\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run(
        [sys.executable, "-m", "runner", "parsers", "list", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    ids = {(p["id"], p["version"]) for p in json.loads(proc.stdout)}
    assert ("lab.const", "3") in ids and ("json.scalar", "1") in ids
    assert "plug-in broken failed to load" in proc.stderr


def test_plug_ins_are_read_only_when_a_lookup_needs_them(tmp_path: Path) -> None:
    """A built-in parser is found without reading any package's entry points (nor importing
    the other built-ins); listing the parsers, or a binding to one that is not built in, loads
    the plug-ins."""
    import os
    import subprocess
    import sys

    site = tmp_path / "site"
    info = site / "lab_parsers-0.1.dist-info"
    info.mkdir(parents=True)
    marker = tmp_path / "imported"
    (site / "lab_parsers.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "class Const:\n"
        "    id = 'lab.const'\n"
        "    version = '3'\n"
        "    description = 'always 42'\n"
        "    config_schema = {'type': 'object'}\n"
        "    def parse(self, evidence, config):\n"
        "        return 42\n"
    )
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lab-parsers\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[runner.parsers]\nconst = lab_parsers:Const\n")
    script = (
        "import os, sys\n"
        "from runner.parsers import registry\n"
        "registry.get('json.scalar', '1')\n"
        f"print(os.path.exists({str(marker)!r}), 'runner.parsers.csv_cell' in sys.modules)\n"
        "print(registry.get(sys.argv[1], '3').parse(None, {}))\n"
        f"print(os.path.exists({str(marker)!r}), 'runner.parsers.csv_cell' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-c", script, "lab.const"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["False False", "42", "True True"]


@pytest.mark.parametrize(
    "pattern",
    [r"acc=(\d+\.\d+)$", r"^step (\d+)", r"loss (\S+)", r"(?<=x)(\d)", r"(\d+)(?!\d)", r"^$()"],
)
@pytest.mark.parametrize("occurrence", ["first", "last"])
def test_regex_chunk_prefilter_changes_no_answer(
    tmp_path: Path, pattern: str, occurrence: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Skipping chunks with one C-level search gives exactly the line-by-line answer, line
    numbers included, across \\n, \\r\\n and lone \\r line ends and chunk boundaries."""
    from runner.parsers import _lines, regex_scalar

    monkeypatch.setattr(_lines, "CHUNK_BYTES", 4096)
    lines = []
    for i in range(20000):
        end = ("\n", "\r\n", "\r")[i % 3]
        body = f"step {i} loss {i * 0.5}" if i % 997 == 0 else f"noise x{i % 10} line"
        if i == 19990:
            body = "acc=0.819"
        lines.append(body + end)
    path = tmp_path / "log.txt"
    path.write_text("".join(lines), newline="")
    parser = registry.get("regex.scalar", "1")
    config = {"pattern": pattern, "occurrence": occurrence, "type": "string"}

    def answer() -> object:
        try:
            return parser.parse(path, config)
        except EvidenceParseError as exc:
            return str(exc)

    fast = answer()
    monkeypatch.setattr(regex_scalar, "_prefilter", lambda pattern: None)
    assert answer() == fast


def test_every_registered_config_schema_is_valid() -> None:
    """Config schemas are not re-checked at start-up (it costs every run); they are here."""
    import jsonschema

    for entry in registry.catalog():
        jsonschema.Draft202012Validator.check_schema(entry["configSchema"])


def test_the_staged_catalog_follows_the_registered_parsers() -> None:
    """``catalog_json`` (what every job stages as parser-catalog.json) is rendered once a
    process, and again when the registered parsers change: one added, then the same key
    taken by another object."""
    before = registry.catalog_json()
    assert json.loads(before) == registry.catalog() and registry.catalog_json() is before
    one = SimpleNamespace(**{**vars(_Versioned()), "description": "version 9, one"})
    other = SimpleNamespace(**{**vars(_Versioned()), "description": "version 9, another"})
    key = ("json.scalar", "9")
    try:
        registry._REGISTRY.parsers[key] = one
        assert "version 9, one" in registry.catalog_json().decode()
        registry._REGISTRY.parsers[key] = other
        assert "version 9, another" in registry.catalog_json().decode()
    finally:
        registry._REGISTRY.parsers.pop(key, None)
    assert registry.catalog_json() == before


class _Versioned:
    def __init__(self) -> None:
        self.id = "json.scalar"
        self.version = "9"
        self.description = ""
        self.config_schema: dict[str, Any] = {"type": "object"}
