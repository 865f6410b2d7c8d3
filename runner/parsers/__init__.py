"""Evidence parsers, registered by ``(id, version)``.

Every parser streams its evidence file: memory stays bounded whatever the file's size.

- ``json.scalar@1``: a value in one JSON document, by RFC 6901 pointer.
- ``jsonl.scalar@1``: a value in one record of a JSON-lines log (first, last, or matching).
- ``regex.scalar@1``: a value captured by a regular expression in a text log.
- ``csv.cell@1``: one cell of a CSV table, by column name and row.
- ``junit.summary@1``: a test count from a JUnit XML report.
- ``agent.result@1``: a value from the agent's own result file (default: its status).

``registry.catalog()`` lists them with their config schemas.

Third-party parsers register through the ``runner.parsers`` entry-point group: each entry
point names a parser class (instantiated without arguments) or object with ``id``,
``version``, ``description``, ``config_schema`` and ``parse``. A broken plug-in is reported
when the parsers are listed or a contract names it, never silently dropped.
"""

from importlib.metadata import entry_points

from runner.parsers import registry
from runner.parsers.agent_result import AgentResult
from runner.parsers.csv_cell import CsvCell
from runner.parsers.json_scalar import JsonScalar
from runner.parsers.jsonl_scalar import JsonlScalar
from runner.parsers.junit_summary import JunitSummary
from runner.parsers.regex_scalar import RegexScalar

for _parser in (
    JsonScalar(),
    JsonlScalar(),
    RegexScalar(),
    CsvCell(),
    JunitSummary(),
    AgentResult(),
):
    registry.register(_parser)

ENTRY_POINT_GROUP = "runner.parsers"


def _load_plugins() -> None:
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = point.load()
            parser = loaded() if isinstance(loaded, type) else loaded
            registry.register(parser)
        except Exception as exc:  # noqa: BLE001 - a plug-in's failure is recorded, not fatal
            registry.record_broken(point.name, f"{point.value}: {type(exc).__name__}: {exc}")


_load_plugins()

__all__ = ["ENTRY_POINT_GROUP", "registry"]
