"""Start-up: `runner --help`, `runner verify` and `runner verify` with `runner serve` running,
against `python -c pass` (the main benchmark's figure); and, run on its own (``python -m
benchmarks.startup [--against REV] [--run]``), every common command's start-up and import
profile against `python -c pass` and `python -c "import json"`, this checkout beside runner/
at an earlier commit, into benchmarks/results/startup.{json,md}."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks._support import (
    ROOT,
    Bench,
    Row,
    X,
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
    with served(b, "startup-server") as (served_env, count, _):

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


# -- `python -m benchmarks.startup`: start-up alone, this checkout against an earlier one ------

COMMANDS: dict[str, list[str]] = {
    "version": ["--version"],
    "help": ["--help"],
    "verify-help": ["verify", "contract", "--help"],
    "run-help": ["run", "--help"],
    "verify": ["verify", "contract", "{toy}", "--allow-unsigned"],
    "run": ["run", "{pinned}", "--allow-unsigned", "--json", "--state-dir", "{state}",
            "--job-id", "{job}"],
}  # fmt: skip
"""The command lines timed, as ``runner ARGS`` in a fresh interpreter each (``run`` only with
``--run``: it needs the engine and the toy image)."""

LABELS = {
    "version": "runner --version",
    "help": "runner --help",
    "verify-help": "runner verify contract --help",
    "run-help": "runner run --help",
    "verify": "runner verify contract TOY --allow-unsigned",
    "run": "runner run TOY --allow-unsigned --json",
}
"""How the report names them (TOY: the toy contract, pinned by image id)."""

PROFILES = 3
"""``-X importtime`` runs per command; the report keeps the one with the least import time
(the least disturbed by the machine's other work: one sample is noise on a shared machine)."""

BASELINES = {"pass": ["-c", "pass"], "json": ["-c", "import json"]}
"""The floor, measured in the same run: an interpreter that does nothing, and one that imports
a small standard module."""


def _cpu_and_wall(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, the child's own) of one command."""
    import os
    import subprocess
    import time

    t = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=env, cwd=env["PYTHONPATH"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if status != 0:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise RuntimeError(f"{argv}: exit status {status}: {err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def third_party(modules: Iterable[str]) -> list[str]:
    """The top-level packages among ``modules`` that are neither the standard library's nor
    the runner's (``org`` is the stdlib ``copy`` module's probe for Jython, which importtime
    lists although it fails)."""
    tops = {m.split(".")[0] for m in modules}
    stdlib = set(sys.stdlib_module_names) | {"org", "_distutils_hack", "sitecustomize"}
    return sorted(t for t in tops - stdlib - {"runner"} if not t.startswith("_sysconfigdata"))


def _imports(argv: list[str], env: dict[str, str], top: int) -> dict[str, Any]:
    """``-X importtime`` of one command: modules, total, the heaviest by cumulative time."""
    import re
    import subprocess

    proc = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]],
        env=env,
        cwd=env["PYTHONPATH"],  # `python -m` looks in its folder first
        capture_output=True,
        text=True,
    )
    rows = []
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            rows.append((int(m[1]), int(m[2]), m[4]))
    return {
        "modules": len(rows),
        "totalSeconds": sum(r[0] for r in rows) / 1e6,
        "byCumulative": [{"module": n, "cumulativeSeconds": c / 1e6, "selfSeconds": s / 1e6}
                         for s, c, n in sorted(rows, key=lambda r: -r[1])[:top]],
        "thirdParty": third_party(n for _, _, n in rows),
    }  # fmt: skip


def _tree_of(rev: str, into: Path) -> Path:
    """``runner/`` as it was at ``rev`` (git archive), to import from."""
    import subprocess
    import tarfile

    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "runner"],
        capture_output=True,
        check=True,
    ).stdout
    import io

    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def measure(reps: int, against: str | None, with_run: bool, top: int) -> dict[str, Any]:
    """Every command of :data:`COMMANDS` and both baselines, ``reps`` times each, interleaved
    (this checkout and ``against`` alternating, order reversed every other round)."""
    import json
    import os
    import tempfile

    from runner.contract import with_digest
    from runner.testing import TOY

    tmp = Path(tempfile.mkdtemp(prefix="runner-startup-"))
    data = json.loads((TOY / "task.json").read_text())
    data["environment"]["image"] = "sha256:" + "ab" * 32  # pinned: verify needs no engine
    toy = tmp / "task.json"
    toy.write_text(json.dumps(with_digest(data)))
    fill = {"toy": str(toy), "state": str(tmp / "state"), "pinned": "", "job": ""}
    names = [n for n in COMMANDS if n != "run" or with_run]
    if with_run:
        from runner.app import issuer
        from runner.testing import IMAGE, write_contract

        pinned = write_contract(tmp / "toy", IMAGE)
        issuer.pin(pinned, IMAGE)
        fill["pinned"] = str(pinned)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    base_env.pop("PYTHONDONTWRITEBYTECODE", None)
    base_env |= {"RUNNER_SERVER": "off", "RUNNER_CONFIG_DIR": str(tmp / "config")}
    trees = {"now": ROOT}
    if against:
        trees["before"] = _tree_of(against, tmp / "before")
    envs = {
        which: base_env | {"PYTHONPATH": str(root), "PYTHONPYCACHEPREFIX": str(tmp / which)}
        for which, root in trees.items()
    }
    py = sys.executable
    counter = iter(range(10**9))

    def argv_of(name: str) -> list[str]:
        if name in BASELINES:
            return [py, *BASELINES[name]]
        values = fill | {"job": f"startup-{next(counter)}"}
        return [py, "-m", "runner", *(a.format(**values) for a in COMMANDS[name])]

    cases = [("base", n) for n in BASELINES] + [(w, n) for n in names for w in trees]
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {c: [] for c in cases}
    for case in cases:  # warm: page cache, bytecode cache
        _cpu_and_wall(argv_of(case[1]), envs["now" if case[0] == "base" else case[0]])
    for i in range(reps):
        for which, name in cases if i % 2 == 0 else cases[::-1]:
            env = envs["now" if which == "base" else which]
            samples[(which, name)].append(_cpu_and_wall(argv_of(name), env))
    profiles: dict[str, dict[str, Any]] = {}
    for _ in range(PROFILES):  # interleaved too; each command's least disturbed profile kept
        for name in names:
            for which in trees:
                got = _imports(argv_of(name), envs[which], top)
                kept = profiles.get(f"{which}:{name}")
                if kept is None or got["totalSeconds"] < kept["totalSeconds"]:
                    profiles[f"{which}:{name}"] = got
    out: dict[str, Any] = {"reps": reps, "against": against, "figures": []}
    floor = {n: samples[("base", n)] for n in BASELINES}
    for which, name in cases:
        xs = samples[(which, name)]
        wall = summary([x[0] for x in xs])
        cpu = summary([x[1] for x in xs])
        row: dict[str, Any] = {"tree": which, "command": name, "wall": wall, "cpu": cpu}
        for b_name, ys in floor.items():
            b_wall = statistics.median(y[0] for y in ys)
            b_cpu = statistics.median(y[1] for y in ys)
            row[f"over_{b_name}"] = {
                "wallRatio": wall["median"] / b_wall,
                "wallDifference": wall["median"] - b_wall,
                "cpuRatio": cpu["median"] / b_cpu,
                "cpuDifference": cpu["median"] - b_cpu,
            }
        out["figures"].append(row)
    out["imports"] = profiles
    return out


def startup_markdown(r: dict[str, Any], machine: str) -> str:
    """The report of :func:`measure`."""
    rows = {(f["tree"], f["command"]): f for f in r["figures"]}
    trees = ["now", *(["before"] if r["against"] else [])]
    lines = [
        "# Runner start-up",
        "",
        f"`python -m benchmarks.startup` ({machine}); {r['reps']} interleaved repeats; "
        + (f"`before` is runner/ at `{r['against']}`, `now` this checkout. " if r["against"]
           else "")
        + "Each command in a fresh interpreter, bytecode cached. The baselines, measured in the "
        "same run: `python -c pass` and `python -c \"import json\"`. Wall and CPU (user + "
        "system of the process itself) medians; the CPU figure is the steadier one on a "
        "loaded machine. Import profiles: the least of "
        f"{PROFILES} `-X importtime` runs each. The engine's own time (the `run` row's "
        "container) is in the wall figure only.",
        "",
        "| command | tree | wall | CPU | wall over `pass` | CPU over `pass` "
        "| CPU over `import json` | modules imported | import time (importtime) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name in ("pass", "json"):
        f = rows[("base", name)]
        lines.append(
            f"| `python {' '.join(BASELINES[name])}` | baseline | {f['wall']['median']:.3f} s | "
            f"{f['cpu']['median']:.3f} s | | | | | |"
        )
    commands = [c for c in COMMANDS if ("now", c) in rows]
    for name in commands:
        for which in trees:
            f = rows[(which, name)]
            p, j = f["over_pass"], f["over_json"]
            imp = r["imports"][f"{which}:{name}"]
            lines.append(
                f"| `{LABELS[name]}` | {which} | "
                f"{f['wall']['median']:.3f} s | {f['cpu']['median']:.3f} s | "
                f"{p['wallRatio']:.2f}{X}, +{p['wallDifference']:.3f} s | "
                f"{p['cpuRatio']:.2f}{X}, +{p['cpuDifference']:.3f} s | "
                f"{j['cpuRatio']:.2f}{X}, +{j['cpuDifference']:.3f} s | {imp['modules']} | "
                f"{imp['totalSeconds']:.3f} s |"
            )
    for name in commands:
        for which in trees:
            imp = r["imports"][f"{which}:{name}"]
            lines += [
                "",
                f"## `{name}`, {which}: {imp['modules']} modules, {imp['totalSeconds']:.3f} s "
                "of imports (importtime inflates them)",
                "",
                "third-party packages imported (or probed, as optional ones are): "
                + (", ".join(imp["thirdParty"]) or "none"),
                "",
                "| module | cumulative | self |",
                "|---|---|---|",
                *(f"| {m['module']} | {m['cumulativeSeconds'] * 1000:.1f} ms | "
                  f"{m['selfSeconds'] * 1000:.1f} ms |" for m in imp["byCumulative"]),
            ]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import os
    import platform

    p = argparse.ArgumentParser(
        prog="python -m benchmarks.startup",
        description="Start-up of `runner` commands against `python -c pass` and "
        '`python -c "import json"`, optionally against runner/ at an earlier commit.',
    )
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--against", metavar="REV", help="also measure runner/ at this commit")
    p.add_argument("--run", action="store_true", help="also a toy `runner run` (the engine)")
    p.add_argument("--top", type=int, default=12, help="modules listed per import profile")
    p.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--name", default="startup")
    args = p.parse_args(argv)
    report = measure(args.repeats, args.against, args.run, args.top)
    machine = (
        f"{os.cpu_count()} cores, Python {platform.python_version()}, load average "
        f"{os.getloadavg()[0]:.2f} at the end"
    )
    report["machine"] = machine
    md = startup_markdown(report, machine)
    print(md)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out_dir / f"{args.name}.md").write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
