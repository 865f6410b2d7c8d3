"""Start-up: `runner --help`, `runner verify` and `runner verify` with `runner serve` running,
against `python -c pass`."""

from __future__ import annotations

import statistics
import sys

from benchmarks._support import (
    Bench,
    Row,
    ratio_rows,
    served,
    summary,
    timed_command,
)


def fig_startup(b: Bench, reps: int) -> list[Row]:
    pass_ = [sys.executable, "-c", "pass"]
    cases = {
        "help": [*b.runner, "--help"],
        "verify": [*b.runner, "verify", str(b.toy), "--allow-unsigned"],
    }
    nocache = {**b.s.env_as_given, "PYTHONDONTWRITEBYTECODE": "1", "RUNNER_SERVER": "off"}
    names = ["pass", "help", "verify", "help-no-bytecode", "verify-served"]
    samples: dict[str, list[float]] = {name: [] for name in names}
    with served(b, "startup-server") as (served_env, count):

        def timed(name: str) -> float:
            if name == "pass":
                return timed_command(b, pass_)
            if name == "help-no-bytecode":
                return timed_command(b, cases["help"], nocache)
            if name == "verify-served":
                return timed_command(b, cases["verify"], served_env)
            return timed_command(b, cases[name])

        for name in names:  # warm the page cache and the bytecode cache
            timed(name)
        for i in range(reps):
            for name in reversed(names) if i % 2 else names:
                samples[name].append(timed(name))
        if count() < reps + 1:
            raise RuntimeError(f"only {count()} of {reps + 1} verifies went to the server")
    rows = []
    for name, label in (
        ("help", "`runner --help`"),
        ("verify", "`runner verify` (toy)"),
        ("verify-served", "`runner verify` (toy) with `runner serve` running"),
    ):
        xs, ys = samples[name], samples["pass"]
        diff = statistics.median(xs) - statistics.median(ys)
        row = Row(
            f"{label} start-up",
            f"startup-{name}",
            "s",
            "`python -c pass` (the same interpreter)",
            summary(ys),
            summary(xs),
            statistics.median(xs) / statistics.median(ys),
            "≤ +0.25 s over the baseline",
            diff <= 0.25,
            ratio_rows(xs, ys),
            extra={"differenceSeconds": diff,
                   "pairedDifference": summary([x - y for x, y in zip(xs, ys, strict=True)])},
        )  # fmt: skip
        row.notes.append(f"difference of medians: +{diff:.3f} s")
        if name == "help":
            cold = statistics.median(samples["help-no-bytecode"]) - statistics.median(ys)
            row.extra["noBytecodeCacheDifferenceSeconds"] = cold
            row.extra["noBytecodeCache"] = summary(samples["help-no-bytecode"])
            row.notes.append(
                f"with PYTHONDONTWRITEBYTECODE=1 (no .pyc for the runner's own modules in an "
                f"editable install, as this machine's environment sets it): +{cold:.3f} s; the "
                "table measures the steady state, bytecode cached under a temporary "
                "PYTHONPYCACHEPREFIX"
            )
        rows.append(row)
    return rows
