"""Generate the JSON Schemas in ``contracts/`` from the pydantic models, and the generated
tables: the parser catalog from the parser registry, the envelope's fields from its model, the
exit codes and failure categories from the category table (``runner.core.errors``), the
result.json flag codes from ``runner.evidence.selfreport.FLAGS``. The documentation site's
reference pages carry them all (``scripts/gen_docs.py`` writes them with these renderers); the
README carries the blocks whose markers it has (the exit codes), and those are rewritten here.

``python -m runner.app.schemas`` rewrites them; ``python -m runner.app.schemas --check`` exits 1
when a
checked-in file differs (the test suite runs the check).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from runner.contract.models import ExecutionContract
from runner.evidence import selfreport
from runner.models import selfreport as result_models
from runner.models.envelope import ResultEnvelope
from runner.models.replay import ReplayReport
from runner.models.selfreport import json_schema as selfreport_schema
from runner.planning.policy import HostPolicy
from runner.state.ledger import LedgerEvent

__all__ = [
    "CONTRACTS",
    "categories_markdown",
    "contract_fields_markdown",
    "envelope_fields_markdown",
    "exit_codes_markdown",
    "main",
    "model_fields_markdown",
    "parser_catalog_markdown",
    "render",
    "schemas",
]

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"
README = CONTRACTS.parent / "README.md"


def envelope_fields_markdown() -> str:
    """The README's table of result-envelope fields, from the envelope's JSON Schema."""
    schema = ResultEnvelope.model_json_schema(mode="serialization")
    required = set(schema.get("required", []))
    rows = ["| field | type | meaning |", "|---|---|---|"]
    for name, prop in schema["properties"].items():
        kind = _type_name(prop)
        flag = "" if name in required else " (optional)"
        rows.append(f"| `{name}`{flag} | {kind} | {prop.get('description', '')} |")
    return "\n".join(rows) + "\n"


def contract_fields_markdown() -> str:
    """The README's contract vocabulary, from the contract's JSON Schema: every field, its
    type and meaning; objects marked *open* carry fields beyond these to the job unchanged,
    the others refuse an unknown field with its JSON path."""
    return model_fields_markdown(ExecutionContract)


def model_fields_markdown(model: type[BaseModel], *, defaults: bool = False) -> str:
    """A table of every field of ``model`` (nested ones by their dotted path, ``[]`` for a
    list's items), from its JSON Schema: its type and meaning, marked *open* where an object
    carries fields beyond these; with ``defaults``, each field's default (as JSON) too."""
    schema = model.model_json_schema(mode="validation")
    defs: dict[str, Any] = schema.get("$defs", {})
    if defaults:
        rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    else:
        rows = ["| field | type | meaning |", "|---|---|---|"]

    def ref_of(prop: dict[str, Any]) -> str | None:
        for p in [prop, *prop.get("anyOf", []), prop.get("items", {})]:
            if "$ref" in p:
                return str(p["$ref"].rsplit("/", 1)[-1])
            if p.get("type") == "array" and "$ref" in p.get("items", {}):
                return str(p["items"]["$ref"].rsplit("/", 1)[-1])
        return None

    def walk(prefix: str, node: dict[str, Any]) -> None:
        required = set(node.get("required", []))
        for name, prop in node.get("properties", {}).items():
            path = f"{prefix}{name}"
            target = ref_of(prop)
            sub = defs.get(target, {}) if target else {}
            flag = " (required)" if name in required else ""
            meaning = prop.get("description") or sub.get("description", "")
            if sub and sub.get("additionalProperties") is not False:
                meaning += " *Open:* other fields are carried to the job."
            meaning = " ".join(meaning.split())
            if defaults:
                given = f"`{json.dumps(prop['default'])}`" if "default" in prop else ""
                cells = [_type_name(prop), given.replace("|", "\\|"), meaning]
            else:
                cells = [_type_name(prop), meaning]
            rows.append(f"| `{path}`{flag} | " + " | ".join(cells) + " |")
            if sub:
                is_list = prop.get("type") == "array" or any(
                    p.get("type") == "array" for p in prop.get("anyOf", [])
                )
                walk(f"{path}[].", sub) if is_list else walk(f"{path}.", sub)

    walk("", schema)
    return "\n".join(rows) + "\n"


def _type_name(prop: dict[str, Any]) -> str:
    if "$ref" in prop:
        return f"`{prop['$ref'].rsplit('/', 1)[-1]}`"
    if "anyOf" in prop:
        return " or ".join(_type_name(p) for p in prop["anyOf"])
    if prop.get("type") == "array":
        return f"list of {_type_name(prop.get('items', {}))}"
    if "enum" in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    return str(prop.get("type", "any"))


def parser_catalog_markdown() -> str:
    """The README's parser catalog, from the registry (what `runner parsers` prints)."""
    from runner.parsers import registry

    out = []
    for entry in registry.catalog():
        schema = entry["configSchema"]
        required = set(schema.get("required", []))
        out.append(f"**`{entry['id']}`** version `{entry['version']}`: {entry['description']}")
        out.append("")
        for name, prop in schema.get("properties", {}).items():
            flag = " (required)" if name in required else ""
            out.append(f"- `{name}`{flag}: {prop.get('description', '')}")
        out.append("")
    return "\n".join(out)


def exit_codes_markdown() -> str:
    """The README's exit-code table, from the category table (runner.core.errors)."""
    from runner.core.errors import Category, Family

    rows = ["| code | meaning |", "|---|---|"]
    usage = (2, "the command line was wrong")
    for code, doc in sorted([*((f.code, f.doc) for f in Family), usage]):
        cats = [f"`{c.value}`" for c in Category if c.family.code == code]
        rows.append(f"| {code} | {doc}" + (f": {', '.join(cats)}" if cats else "") + " |")
    return "\n".join(rows) + "\n"


def categories_markdown() -> str:
    """The README's table of failure categories, from the category table (runner.core.errors)."""
    from runner.core.errors import Category

    rows = [
        "| category | exit | ends the job | retryable | when |",
        "|---|---|---|---|---|",
    ]
    for c in Category:
        final = "yes" if c.final else "no"
        retry = "yes" if c.retryable else "no"
        rows.append(f"| `{c.value}` | {c.family.code} | {final} | {retry} | {c.doc} |")
    return "\n".join(rows) + "\n"


def readme_with_blocks(text: str) -> str:
    """README text with every generated block (between its markers) brought up to date."""
    blocks: dict[str, Callable[[], str]] = {
        "parser-catalog": parser_catalog_markdown,
        "envelope-fields": envelope_fields_markdown,
        "contract-fields": contract_fields_markdown,
        "exit-codes": exit_codes_markdown,
        "categories": categories_markdown,
        "result-flags": selfreport.flags_markdown,
    }
    for name, render in blocks.items():
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        if begin not in text:
            continue
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = f"{head}{begin}\n{render()}{end}{tail}"
    return text


def schemas() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for filename, model, title in (
        ("execution-contract.schema.json", ExecutionContract, "Execution contract"),
        ("result-envelope.schema.json", ResultEnvelope, "Result envelope"),
        ("host-policy.schema.json", HostPolicy, "Host policy"),
        ("ledger-event.schema.json", LedgerEvent, "Budget ledger event"),
        ("replay-report.schema.json", ReplayReport, "Replay report"),
    ):
        schema = model.model_json_schema(mode="validation")
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://runner.invalid/contracts/{filename}",
            "title": title,
            **{k: v for k, v in schema.items() if k != "title"},
        }
        out[filename] = schema
    out["agent-result.schema.json"] = selfreport_schema()
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    if not (README.is_file() and CONTRACTS.is_dir()):
        print(
            "runner.app.schemas writes and checks contracts/ and README.md of a source checkout; "
            f"this runner is installed ({CONTRACTS.parent} has neither). "
            "`runner schema NAME` prints any schema from the installed models."
        )
        return 2
    stale = []
    for filename, schema in schemas().items():
        path = CONTRACTS / filename
        text = render(schema)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(filename)
        else:
            path.write_text(text)
    shipped = result_models.SCHEMA_FILE  # the copy a job is given, shipped in the package
    if check:
        if not shipped.is_file() or shipped.read_bytes() != result_models.rendered_schema():
            stale.append(f"runner/models/{shipped.name} (the shipped copy)")
    else:
        shipped.write_bytes(result_models.rendered_schema())
    readme = README.read_text()
    wanted = readme_with_blocks(readme)
    if check and wanted != readme:
        stale.append(
            "README.md generated blocks (those it carries of: parser catalog, envelope and "
            "contract fields, exit codes, categories, result.json flags)"
        )
    elif not check and wanted != readme:
        README.write_text(wanted)
    if stale:
        print("stale schemas (run `python -m runner.app.schemas`): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
