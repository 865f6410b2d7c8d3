"""An agent in the contract's image against the same run in the adapter's own image."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmarks._support import (
    Bench,
    Row,
    interleave,
    ratio_rows,
    size_text,
    summary,
)
from runner.testing import (
    CLAUDE_RUNTIME,
    SCRIPTED_ARGV,
    SCRIPTED_RUNTIME,
    agent_contract,
    agent_policy,
    image_id_of,
)


def fig_agentimage(b: Bench, reps: int) -> Row:
    """The scripted agent's toy evaluation with its commands in the contract's image (the
    runtime brought in from its image, cached after the first run) against the same run in
    the adapter's own image (runIn adapter-image, the way before issue 26); one state folder,
    interleaved. The first run, which extracts the runtime, is timed apart."""
    base = b.s.tmp / "agentimage"
    for sub in ("contract", "in", "own"):
        (base / sub).mkdir(parents=True)
    contract = agent_contract(base / "contract", agent={"maxTurns": 40})
    scripted = image_id_of("runner-agent-scripted:local")
    common: dict[str, Any] = {"argv": SCRIPTED_ARGV, "usage": "claude-code"}
    inside = agent_policy(base / "in", "scripted", scripted, **common, **SCRIPTED_RUNTIME)
    own = agent_policy(base / "own", "scripted", scripted, **common, runIn="adapter-image")
    state = base / "state"
    cache = state / "cache" / "agent-runtimes"

    def run(policy: Path, tag: str) -> float:
        seconds, envelope, _, _ = b.runner_job(
            contract, tag, state, extra=["--policy", str(policy)]
        )
        if envelope["measurements"][0]["value"] != 0.819:
            raise RuntimeError(f"agentimage: {tag} measured {envelope['measurements']}")
        return seconds

    first = run(inside, "agent-first")
    entries = sorted(p for p in cache.iterdir() if p.is_dir())
    stamp = [(p / "runtime.json").stat().st_ino for p in entries]
    run(own, "agent-own-warm")
    xs, ys = interleave(reps, lambda: run(inside, "agent-in"), lambda: run(own, "agent-own"))
    after = sorted(p for p in cache.iterdir() if p.is_dir())
    extracted_once = (
        after == entries and [(p / "runtime.json").stat().st_ino for p in after] == stamp
    )
    added = statistics.median(xs) - statistics.median(ys)
    claude = _claude_extraction(base / "claude-cache")
    paired = [x - y for x, y in zip(xs, ys, strict=True)]
    notes = [
        f"the contract's image adds {added:+.3f} s to the median run (median of the paired "
        f"differences {statistics.median(paired):+.3f} s); target at most +0.3 s",
        f"the first run (extracting the runtime into the cache) took {first:.3f} s",
        *([claude] if claude else []),
        f"the runtime was extracted once for {reps + 1} runs in the contract's image: "
        + ("yes (one cache entry, its runtime.json never rewritten)" if extracted_once else "NO"),
    ]
    row = Row(
        "agent in the contract's image vs the adapter's (runtime cached)",
        "agentimage",
        "s",
        "the same run with runIn adapter-image (the agent in the runtime's own image)",
        summary(ys),
        summary(xs),
        statistics.median(xs) / statistics.median(ys),
        paired=ratio_rows(xs, ys),
        extra={"differenceSeconds": added, "extractedOnce": extracted_once},
        notes=notes,
    )
    row.extra["addedSecondsMedian"] = round(added, 3)
    row.extra["pairedDifferences"] = summary(paired)
    row.extra["firstRunSeconds"] = round(first, 3)
    return row


def _claude_extraction(cache: Path) -> str | None:
    """Claude Code's runtime (its 400 MB binary and wrapper) copied out of
    runner-agent-claude:local into an empty cache, then found there: the seconds of each."""
    from runner import backends
    from runner.execution import agentimage

    engine = backends.default()
    info = engine.inspect_image("runner-agent-claude:local")
    if info is None:
        return None
    paths = list(CLAUDE_RUNTIME["runtimePaths"])  # the claude binary and its wrapper
    labels = {"bench": "agentimage"}
    made = agentimage.ensure(engine, info.id, paths, cache, labels)
    again = agentimage.ensure(engine, info.id, paths, cache, labels)
    size = sum(f.size for f in made.files)
    return (
        f"Claude Code's runtime ({size_text(size)}) copied out of its image, unpacked and "
        f"hashed in {made.seconds:.2f} s, once; found in the cache afterwards in "
        f"{again.seconds:.3f} s"
    )
