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

from runner.parsers.registry import ENTRY_POINT_GROUP

__all__ = ["ENTRY_POINT_GROUP", "registry"]
