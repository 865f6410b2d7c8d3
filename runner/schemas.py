"""Generate the JSON Schemas in ``contracts/`` from the pydantic models, and the README's
parser catalog from the parser registry.

``python -m runner.schemas`` rewrites them; ``python -m runner.schemas --check`` exits 1 when a
checked-in file differs (the test suite runs the check).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from runner.contract.models import ExecutionContract
from runner.envelope import ResultEnvelope
from runner.ledger import LedgerEvent
from runner.policy import HostPolicy

CONTRACTS = Path(__file__).resolve().parent.parent / "contracts"
README = CONTRACTS.parent / "README.md"
BEGIN, END = "<!-- parser-catalog:begin -->", "<!-- parser-catalog:end -->"


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


def _readme_with_catalog(text: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{parser_catalog_markdown()}{END}{tail}"


def schemas() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for filename, model, title in (
        ("execution-contract.schema.json", ExecutionContract, "Execution contract"),
        ("result-envelope.schema.json", ResultEnvelope, "Result envelope"),
        ("host-policy.schema.json", HostPolicy, "Host policy"),
        ("ledger-event.schema.json", LedgerEvent, "Budget ledger event"),
    ):
        schema = model.model_json_schema(mode="validation")
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://runner.invalid/contracts/{filename}",
            "title": title,
            **{k: v for k, v in schema.items() if k != "title"},
        }
        out[filename] = schema
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for filename, schema in schemas().items():
        path = CONTRACTS / filename
        text = render(schema)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(filename)
        else:
            path.write_text(text)
    readme = README.read_text()
    if BEGIN in readme:
        wanted = _readme_with_catalog(readme)
        if check and wanted != readme:
            stale.append("README.md parser catalog")
        elif not check:
            README.write_text(wanted)
    if stale:
        print("stale schemas (run `python -m runner.schemas`): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
