"""The parser registry: parsers are looked up by ``(id, version)``, never by id alone.

A parser declares a JSON Schema for its config; bindings are checked when the contract is
loaded, so a bad binding refuses the job before any container starts. A parser may also have a
``check_config(config)`` method for what a schema cannot say (a regular expression compiles,
the group it names exists); it raises :class:`ConfigError`, which refuses the contract too.

Nothing is imported or scanned when this module is: a built-in parser's module is imported
when it is first looked up (:data:`BUILT_IN` names it, as an entry point names a plug-in's),
and the plug-ins' entry points are read only when every parser is wanted (``available``,
``catalog``, ``broken``) or a binding names one that is not built in. ``runner verify`` of a
contract that binds ``json.scalar`` imports that one parser and scans no installed package.
"""

from __future__ import annotations

import copy
import json
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import jsonschema_rs

from runner.core.errors import ContractError

__all__ = [
    "BUILT_IN",
    "ENTRY_POINT_GROUP",
    "ConfigError",
    "available",
    "broken",
    "catalog",
    "catalog_json",
    "check_binding",
    "compiled_validator",
    "get",
    "record_broken",
    "register",
]


class ConfigError(ValueError):
    """A config the schema accepts but the parser cannot use; ``field`` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class Parser(Protocol):
    """What a parser module provides."""

    id: str
    version: str
    description: str
    config_schema: dict[str, Any]

    def parse(self, evidence: Path, config: dict[str, Any]) -> float | int | str | bool:
        """Extract the value from ``evidence``.

        Raises :class:`~runner.core.errors.EvidenceParseError` when the file cannot yield a valid
        value. The caller has already checked that the file exists.
        """
        ...


class _Binding(Protocol):
    id: str
    version: str
    config: dict[str, Any]


@dataclass(frozen=True)
class _Registry:
    parsers: dict[tuple[str, str], Parser]


_REGISTRY = _Registry(parsers={})

BUILT_IN: dict[tuple[str, str], str] = {
    ("json.scalar", "1"): "json_scalar:JsonScalar",
    ("jsonl.scalar", "1"): "jsonl_scalar:JsonlScalar",
    ("regex.scalar", "1"): "regex_scalar:RegexScalar",
    ("csv.cell", "1"): "csv_cell:CsvCell",
    ("junit.summary", "1"): "junit_summary:JunitSummary",
    ("agent.result", "1"): "agent_result:AgentResult",
}
"""The built-in parsers: ``(id, version)`` -> ``module:class`` under runner/parsers/, the
class instantiated without arguments when the parser is first looked up."""

ENTRY_POINT_GROUP = "runner.parsers"
"""The entry-point group third-party parsers register through."""

_BROKEN: dict[str, str] = {}
_loaded_all = False
_LOADING = threading.RLock()
"""Held while parsers are loaded: another thread waits for the whole registry, while a
plug-in that looks a parser up as it loads (the same thread) sees what is loaded so far."""


def register(parser: Parser) -> Parser:
    """Add ``parser`` under ``(parser.id, parser.version)``; a second registration is an error
    (a built-in's key is taken, whether or not its module is imported yet)."""
    key = (parser.id, parser.version)
    if key in _REGISTRY.parsers or key in BUILT_IN:
        raise ValueError(f"parser {parser.id} version {parser.version} is already registered")
    _REGISTRY.parsers[key] = parser
    return parser


def _built_in(key: tuple[str, str]) -> Parser | None:
    where = BUILT_IN.get(key)
    if where is None:
        return None
    with _LOADING:
        if key not in _REGISTRY.parsers:
            module, name = where.split(":")
            # __import__ rather than importlib.import_module: the same import, but `python -X
            # importtime` sees it.
            loaded = __import__(f"runner.parsers.{module}", fromlist=[name])
            _REGISTRY.parsers[key] = getattr(loaded, name)()
        return _REGISTRY.parsers[key]


def _load_all() -> dict[tuple[str, str], Parser]:
    """Every parser: the built-ins, then the plug-ins (once per process)."""
    global _loaded_all
    with _LOADING:
        if _loaded_all:
            return _REGISTRY.parsers
        _loaded_all = True
        for key in BUILT_IN:
            _built_in(key)
        from importlib.metadata import entry_points

        for point in entry_points(group=ENTRY_POINT_GROUP):
            try:
                loaded = point.load()
                register(loaded() if isinstance(loaded, type) else loaded)
            except Exception as exc:  # noqa: BLE001 - a plug-in's failure is recorded, not fatal
                record_broken(point.name, f"{point.value}: {type(exc).__name__}: {exc}")
    return _REGISTRY.parsers


def _find(key: tuple[str, str]) -> Parser | None:
    if key in _REGISTRY.parsers:
        return _REGISTRY.parsers[key]
    found = _built_in(key)
    return found if found is not None else _load_all().get(key)


def record_broken(name: str, why: str) -> None:
    """A plug-in that failed to load; shown by ``runner parsers`` and in refusals."""
    _BROKEN[name] = why


def broken() -> dict[str, str]:
    """The plug-ins that failed to load, by entry-point name."""
    _load_all()
    return dict(_BROKEN)


def available() -> list[tuple[str, str]]:
    """Every registered ``(id, version)``, sorted."""
    return sorted(_load_all())


def get(parser_id: str, version: str) -> Parser:
    """The parser registered as ``(parser_id, version)``; KeyError when there is none."""
    parser = _find((parser_id, version))
    if parser is None:
        raise KeyError((parser_id, version))
    return parser


def catalog() -> list[dict[str, Any]]:
    """Every registered parser as JSON-ready data, sorted by ``(id, version)``.

    Each entry is ``{"id", "version", "description", "configSchema"}``; the runner writes this
    list to ``/job/input/parser-catalog.json`` and ``runner parsers`` prints it.
    """
    return [
        {
            "id": parser.id,
            "version": parser.version,
            "description": parser.description,
            "configSchema": copy.deepcopy(parser.config_schema),
        }
        for parser in (get(*key) for key in available())
    ]


_CATALOG_JSON: list[tuple[tuple[Parser, ...], bytes]] = []
"""The catalog rendered last, with the parsers it was rendered from."""


def catalog_json() -> bytes:
    """:func:`catalog` as the JSON document staged at ``/job/input/parser-catalog.json``
    (indented, one final newline), rendered again only when the registered parsers are not
    the very ones it was rendered from: every job stages it, and a server's or a batch's
    forks find it rendered."""
    parsers = _load_all()
    now = tuple(parsers[k] for k in sorted(parsers))
    if _CATALOG_JSON:
        then, rendered = _CATALOG_JSON[0]
        if len(then) == len(now) and all(a is b for a, b in zip(then, now, strict=True)):
            return rendered
    rendered = (json.dumps(catalog(), indent=2) + "\n").encode()
    _CATALOG_JSON[:] = [(now, rendered)]
    return rendered


@cache
def compiled_validator(parser_id: str, version: str) -> jsonschema_rs.Draft202012Validator:
    """The parser's config schema, compiled once per process (Draft 2020-12, as declared).

    ``jsonschema-rs`` rather than ``jsonschema``: the same draft and the same verdicts, and it
    imports in about 0.02 s where ``jsonschema`` (with attrs, referencing and rpds) took about
    0.1 s of every ``runner verify`` and ``runner run``.
    """
    parser = get(parser_id, version)
    try:
        return jsonschema_rs.Draft202012Validator(parser.config_schema)
    except (jsonschema_rs.ValidationError, ValueError) as exc:
        raise ContractError(
            f"parser {parser_id}@{version} declares a config schema that is not valid JSON "
            f"Schema: {exc}",
            hint="fix the parser's config_schema (a plug-in's, most likely)",
        ) from exc


def check_binding(binding: _Binding, *, path: str) -> None:
    """Refuse a binding to an unknown parser or with a config its schema rejects."""
    key = (binding.id, binding.version)
    parser = _find(key)
    if parser is None:
        listing = ", ".join(f"{i}@{v}" for i, v in available()) or "none"
        plugins = "".join(f"; plug-in {n} failed to load ({w})" for n, w in _BROKEN.items())
        raise ContractError(
            f"no parser {binding.id!r} version {binding.version!r} is registered",
            path=path,
            hint=f"use one of: {listing}{plugins}",
        )
    errors = sorted(
        compiled_validator(*key).iter_errors(binding.config),
        key=lambda e: [(isinstance(p, str), p) for p in e.instance_path],
    )
    if errors:
        err = errors[0]
        where = (
            path
            + ".config"
            + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.instance_path)
        )
        raise ContractError(
            f"{err.message}",
            path=where,
            hint=f"the config of {binding.id}@{binding.version} is described by its schema: "
            "`runner parsers` lists it",
        )
    check = getattr(parser, "check_config", None)
    if check is not None:
        try:
            check(binding.config)
        except ConfigError as exc:
            raise ContractError(
                str(exc),
                path=f"{path}.config.{exc.field}",
                hint=f"fix the config of {binding.id}@{binding.version}",
            ) from exc
