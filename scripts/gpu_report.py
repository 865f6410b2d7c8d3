"""The GPU end-to-end report (reports/gpu/latest.md) from the work folder scripts/gpu_e2e.sh
fills: the machine, the engine, how the GPU was injected, the device, the figures, the
isolation checks and an excerpt of the envelope. Standard library only (it runs on the GPU
machine's bare Python).

Usage: python3 scripts/gpu_report.py WORK_DIR REPORT.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _text(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:].strip()
    except OSError:
        return ""


def _checks(work: Path) -> list[tuple[str, str, str]]:
    """(check, PASS/FAIL/not run, detail) lines from checks.tsv."""
    out = []
    for line in _text(work / "checks.tsv", 20000).splitlines():
        parts = line.split("\t")
        if len(parts) == 3:
            out.append((parts[0], parts[1], parts[2]))
    return out


def _excerpt(envelope: dict[str, Any]) -> dict[str, Any]:
    keep = ("status", "jobId", "exitCode", "failure", "gpus", "gpuFallback", "measurements")
    out = {k: envelope.get(k) for k in keep if k in envelope}
    for m in out.get("measurements") or []:
        m.pop("evidence", None)
    container = envelope.get("container") or {}
    if container:
        out["container"] = {k: container.get(k) for k in ("image", "runtime", "exitCode")}
    return out


def report(work: Path) -> str:
    facts = _json(work / "facts.json") or {}
    engine = _json(work / "engine-version.json") or {}
    envelope = _json(work / "envelope.json") or {}
    evidence = _json(work / "evidence.json") or {}
    status = _text(work / "status") or "unknown"
    gpus = envelope.get("gpus") or []
    values = {m["measurementId"]: m["value"] for m in envelope.get("measurements") or []}
    rehearsal = " (rehearsal: no GPU, a stand-in driver)" if facts.get("rehearsal") else ""
    lines = [
        "# GPU end to end: the smoke contract through `runner run`",
        "",
        f"- result: **{status}**{rehearsal}",
        f"- when: {facts.get('date', '?')}, runner {facts.get('commit', '?')}",
        f"- machine: {facts.get('os', '?')}, kernel {facts.get('kernel', '?')}, "
        f"cgroup {facts.get('cgroup', '?')}, Python {facts.get('python', '?')}",
        f"- GPUs on the host (nvidia-smi): {facts.get('smi', '?')}",
        f"- engine: Docker {engine.get('Version', '?')} (API {engine.get('ApiVersion', '?')}), "
        "Debian's binaries from the bundle, started by the script "
        "(`--iptables=false --bridge=none`, overlay2)",
    ]
    if gpus:
        g = gpus[0]
        lines.append(
            f"- injection: **{g.get('injection')}** ({g.get('cdiDevice')}); device "
            f"{g.get('index')}: {g.get('model')} {g.get('uuid')}, driver {g.get('driverVersion')}"
        )
    lines += [
        "",
        "## Figures (from the envelope's measurements)",
        "",
        "| measurement | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in values.items()),
    ]
    if evidence:
        lines += [
            "",
            f"Evidence: CUDA driver {evidence.get('cudaDriverVersion')}, compute capability "
            f"{evidence.get('computeCapability')}, {evidence.get('kernelElements')} elements, "
            f"{evidence.get('kernelWrong')} wrong; nvidia-smi inside: "
            f"`{json.dumps(evidence.get('nvidiaSmi'))}`",
        ]
    checks = _checks(work)
    if checks:
        lines += ["", "## Checks", "", "| check | result | detail |", "|---|---|---|"]
        lines += [f"| {c} | {r} | {d} |" for c, r, d in checks]
    lines += [
        "",
        "## Envelope excerpt",
        "",
        "```json",
        json.dumps(_excerpt(envelope), indent=2) if envelope else "(no envelope)",
        "```",
        "",
        "## Log",
        "",
        "```",
        _text(work / "e2e.log", 6000),
        "```",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    work, dest = Path(sys.argv[1]), Path(sys.argv[2])
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(report(work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
