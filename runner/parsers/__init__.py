"""Evidence parsers, registered by ``(id, version)``.

Every parser streams its evidence file: memory stays bounded whatever the file's size.

- ``json.scalar@1``: a value in one JSON document, by RFC 6901 pointer.
- ``jsonl.scalar@1``: a value in one record of a JSON-lines log (first, last, or matching).
- ``regex.scalar@1``: a value captured by a regular expression in a text log.
- ``csv.cell@1``: one cell of a CSV table, by column name and row.
- ``junit.summary@1``: a test count from a JUnit XML report.
- ``agent.result@1``: a value from the agent's own result file (default: its status).

``registry.catalog()`` lists them with their config schemas.
"""

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

__all__ = ["registry"]
