"""The one table of failure categories (runner.core.errors): every other table derives from it."""

from __future__ import annotations

import runner.core.errors as errors_module
from runner.core.errors import FINAL, REFUSALS, Category, Family, RunnerError, exit_family
from runner.models.envelope import Failure


def _error_classes() -> list[type[RunnerError]]:
    found: list[type[RunnerError]] = []
    todo: list[type[RunnerError]] = [RunnerError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_error_class_names_a_category_of_the_table() -> None:
    for cls in _error_classes():
        assert isinstance(cls.category, Category), cls


def test_families_and_exit_codes() -> None:
    assert [f.code for f in Family] == [130, 4, 3, 5, 1, 0]  # also the batch's precedence
    assert {c for c in Category if exit_family(c) == "refused"} == REFUSALS
    assert exit_family(None) == "succeeded"
    assert exit_family("timeout") == "job_failed"
    assert exit_family(Category.GPU_UNAVAILABLE) == "infrastructure"


def test_job_busy_is_infrastructure_not_a_refusal() -> None:
    assert issubclass(errors_module.JobBusy, errors_module.InfrastructureError)
    assert not issubclass(errors_module.JobBusy, errors_module.RefusedError)
    assert errors_module.JobBusy("x").category.family is Family.INFRASTRUCTURE


def test_final_categories_are_the_attempt_endings() -> None:
    assert {c.value for c in FINAL} == {
        "nonzero_exit",
        "oom",
        "timeout",
        "disk_quota_exceeded",
        "log_limit_exceeded",
        "resource_exhausted",  # an agent stopped past its turns or budget
    }


def test_the_envelope_takes_exactly_the_table() -> None:
    schema = Failure.model_json_schema()
    enum = schema["$defs"]["Category"]["enum"]
    assert enum == [c.value for c in Category]


def test_the_cli_agrees_with_the_table() -> None:
    """The CLI's exit constants and its exit-code help text (kept static, so that `runner
    --help` does not import the table) say what the table says."""
    from runner.cli import _common

    constants = {
        Family.SUCCEEDED: _common.EXIT_SUCCEEDED,
        Family.JOB_FAILED: _common.EXIT_JOB_FAILED,
        Family.REFUSED: _common.EXIT_REFUSED,
        Family.INFRASTRUCTURE: _common.EXIT_INFRASTRUCTURE,
        Family.CANCELLED: _common.EXIT_CANCELLED,
        Family.NOT_FOUND: _common.EXIT_NOT_FOUND,
    }
    assert all(family.code == code for family, code in constants.items())
    lines = _common.EXIT_CODES_HELP.splitlines()
    for family in Family:
        assert any(line.strip().startswith(str(family.code)) for line in lines), family
    assert _common.batch_exit([{"failure": None}, {"failure": {"category": "oom"}}]) == 1
    assert _common.batch_exit([{"failure": {"category": "cancelled"}}, {"failure": None}]) == 130
