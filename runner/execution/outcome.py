"""How an attempt ended, as a failure category: a table of rules over the container's end.

The first rule that holds names the category. The runner's own reasons to stop the job come
first (it knows why it stopped it: Ctrl-C, a quota, the budget), then what the engine says of
the container (OOM-killed, an engine error, the job's exit code). Tested on container states
captured from the real engine (``tests/fixtures/engine-states``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from runner.core.errors import Category
from runner.execution.container import Outcome
from runner.models.envelope import Failure

__all__ = ["classify", "inputs_changed"]


@dataclass(frozen=True)
class _Rule:
    holds: Callable[[Outcome], bool]
    category: Category
    reason: Callable[[Outcome, float], str]


_RULES = (
    _Rule(
        lambda o: o.cancelled,
        Category.CANCELLED,
        lambda o, b: "the runner was interrupted (Ctrl-C or SIGTERM) and stopped the job",
    ),
    _Rule(
        lambda o: o.stopped_for == "disk_quota_exceeded",
        Category.DISK_QUOTA_EXCEEDED,
        lambda o, b: (
            "the job wrote more to output/ and workspace/ than its disk quota allows "
            "and was stopped; its files are kept (the envelope's disk record says how much)"
        ),
    ),
    _Rule(
        lambda o: o.stopped_for == "log_limit_exceeded",
        Category.LOG_LIMIT_EXCEEDED,
        lambda o, b: (
            "the job wrote more to stdout or stderr than the cap allows and this host "
            "stops such jobs; the first and last parts of the log are kept"
        ),
    ),
    _Rule(
        lambda o: (o.stopped_for or "").startswith("agent."),
        Category.RESOURCE_EXHAUSTED,
        lambda o, b: f"the agent passed {o.stopped_for} and was stopped (usage in agentUsage)",
    ),
    _Rule(
        lambda o: o.timed_out,
        Category.TIMEOUT,
        lambda o, b: (
            f"the job used its whole budget ({b:.1f} s over every attempt) and was stopped"
        ),
    ),
    _Rule(
        lambda o: o.state.oom_killed,
        Category.OOM,
        lambda o, b: (
            "the job (or a process in it) was killed for exceeding its memory cap "
            f"(exit code {o.state.exit_code})"
        ),
    ),
    _Rule(
        lambda o: bool(o.state.error),
        Category.INFRASTRUCTURE,
        lambda o, b: f"the engine reported: {o.state.error}",
    ),
    _Rule(
        lambda o: o.state.exit_code != 0,
        Category.NONZERO_EXIT,
        lambda o, b: f"the job exited with code {o.state.exit_code}; see its stderr",
    ),
)


def classify(outcome: Outcome, budget_seconds: float) -> Failure | None:
    """The failure an attempt's end amounts to; None when the job exited 0 by itself."""
    for rule in _RULES:
        if rule.holds(outcome):
            return Failure(
                category=rule.category,
                stage="container",
                retryable=rule.category.retryable,
                reason=rule.reason(outcome, budget_seconds),
            )
    return None


def inputs_changed(problem: str, removed: list[str], failure: Failure | None) -> Failure:
    """``input/`` was not, after the job, what was staged (``problem``: the first change;
    ``removed``: the input cache entries then found changed and removed): the run is
    ``input_digest_mismatch`` whatever else it did (``failure``, named in the reason), since
    the job read other inputs than the ones the contract binds."""
    cached = "".join(f"; cache entry sha256:{h[:12]}… changed too, removed" for h in removed)
    also = f" (the job also ended {failure.category}: {failure.reason})" if failure else ""
    return Failure(
        category=Category.INPUT_DIGEST_MISMATCH,
        stage="container",
        retryable=False,
        reason=(
            f"the staged inputs changed while the job ran ({problem}): what the job read is "
            f"not what the contract binds, so no value of this run is its result{cached}{also}"
        ),
    )
