"""Regression tests for issue 25 item 1: the agent's API key in the signed envelope and the
bundle. A hostile prompt made the agent ask the egress proxy for ``http://<allowed host>/<key>``
and ``CONNECT <key>.example:443``, and listed a file holding the key as evidence; the key went
unredacted into egress.log, the envelope's connections, the signed statement, ``--json``, the
bundle and the proxy's engine log. Now one redaction step (runner/core/redaction.py) covers
everything the runner writes, signs or exports of such an attempt, in the value's usual
encodings, the proxy blanks its own log lines from salted digests, and a job's file that holds
the key is withheld from export, named with why.

The tests that need the engine are in tests/integration/test_hostile_secrets.py.
"""

from __future__ import annotations

import base64
import importlib.machinery
import importlib.util
import json
import tarfile
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from runner.core.redaction import REDACTED, Redactor, base64_cores
from tests.support import ROOT, run_cli

KEY = "sk-ant-made-up-for-this-test-7d2e91b4c0a5f3"
MARK = REDACTED.format(name="API_KEY")


def encodings(value: str) -> dict[str, bytes]:
    """The value as the tests look for it, computed here independently of the runner: plain,
    hex (both cases), fully percent-encoded (both cases of the hex digits), and the middle of
    its base64 (both alphabets) at each of the three alignments, which any base64 of a longer
    string holding the value contains."""
    raw = value.encode()
    found = {
        "plain": raw,
        "hex": raw.hex().encode(),
        "HEX": raw.hex().upper().encode(),
        "url": "".join(f"%{b:02X}" for b in raw).encode(),
        "url-lower": "".join(f"%{b:02x}" for b in raw).encode(),
    }
    for k in range(3):
        encoded = base64.b64encode(b"\xff" * k + raw)
        middle = encoded[4:-4]
        found[f"base64-{k}"] = middle
        found[f"base64url-{k}"] = middle.translate(bytes.maketrans(b"+/", b"-_"))
    return found


def holding(data: bytes, value: str = KEY) -> list[str]:
    return [name for name, needle in encodings(value).items() if needle in data]


# --- the redaction step itself ---------------------------------------------------------------


@pytest.mark.parametrize("before", [b"", b"x", b"xy", b"xyz", b'{"a": "', b"\x00\x01"])
def test_every_encoding_is_found_at_every_alignment(before: bytes) -> None:
    """The value inside a longer string, then that string encoded: each form is replaced
    with the marker, whatever comes before it (so every base64 alignment is met)."""
    redactor = Redactor({"API_KEY": KEY})
    raw = before + KEY.encode() + b"-and-after"
    forms = {
        "plain": raw,
        "hex": raw.hex().encode(),
        "HEX": raw.hex().upper().encode(),
        "url": urllib.parse.quote_from_bytes(raw, safe="").encode(),
        "url-all": "".join(f"%{b:02x}" for b in raw).encode(),
        "url-mixed": b"".join(
            (f"%{b:02X}".encode() if i % 2 else bytes([b])) for i, b in enumerate(raw)
        ),
        "base64": base64.b64encode(raw),
        "base64url": base64.urlsafe_b64encode(raw),
        "base64-in-url": urllib.parse.quote(base64.b64encode(raw), safe="").encode(),
        "stray-percent": b"%"
        + b"".join((f"%{b:02x}".encode() if i % 3 == 2 else bytes([b])) for i, b in enumerate(raw)),
        "base64-wrapped": b"\n".join(
            base64.b64encode(raw * 3)[i : i + 20] for i in range(0, 4 * len(raw), 20)
        ),
    }
    for name, data in forms.items():
        text = b"GET /v1/" + data + b" HTTP/1.1"
        out = redactor.bytes(text)
        assert redactor.found(text) == ["API_KEY"], name
        assert MARK.encode() in out, (name, out)
        assert holding(out) == [], (name, out)


def test_the_marker_keeps_nothing_of_the_value() -> None:
    """The same marker whatever the value's length or form: nothing to count characters by."""
    short, long = Redactor({"K": "sk-" + "a" * 10}), Redactor({"K": "sk-" + "b" * 200})
    assert short.text("x sk-aaaaaaaaaa y") == long.text("x sk-" + "b" * 200 + " y")
    # base64: the characters of the value alone go; at most one at each end, which mixes a
    # few of its bits with its neighbours' (or padding), stays
    assert short.text(base64.b64encode(b"sk-" + b"a" * 10).decode()) == "[redacted: K]Q=="


def test_base64_cores_are_the_characters_of_the_value_alone() -> None:
    value = KEY.encode()
    for k in range(3):
        for neighbour in (b"\x00", b"\xff", b"Q"):
            encoded = base64.b64encode(neighbour * k + value + neighbour * 2)
            assert any(core in encoded for core in base64_cores(value)), (k, neighbour)


def test_streamed_files_are_redacted_across_chunks(tmp_path: Path) -> None:
    """Every form straddling the 1 MiB read boundary, in a file redacted in place."""
    redactor = Redactor({"API_KEY": KEY})
    forms = [KEY.encode(), KEY.encode().hex().encode(), base64.b64encode(b"z" + KEY.encode())]
    for i, form in enumerate(forms):
        path = tmp_path / f"f{i}.log"
        path.write_bytes(b"a" * (1024 * 1024 - 7) + form + b"\ntail")
        assert redactor.files(tmp_path, [path.name]) == [path.name]
        data = path.read_bytes()
        assert holding(data) == [] and MARK.encode() in data[-40:], i
        assert data.startswith(b"a" * (1024 * 1024 - 7)) and data.endswith(b"\ntail"), i


def test_json_values_are_redacted_in_keys_and_strings() -> None:
    redactor = Redactor({"API_KEY": KEY})
    value = {KEY: [{"target": f"http://h/{KEY}"}, 3, None, {"n": base64.b64encode(KEY.encode())
                                                            .decode()}]}  # fmt: skip
    out = redactor.value(value)
    assert holding(json.dumps(out).encode()) == []
    assert out == {MARK: [{"target": f"http://h/{MARK}"}, 3, None, {"n": MARK + "w=="}]}


def _proxy() -> ModuleType:
    path = ROOT / "images" / "proxy" / "egress-proxy"
    loader = importlib.machinery.SourceFileLoader("egress_proxy_under_test", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_proxy_blanks_its_log_fields_from_digests_before_cutting_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The proxy's rules carry salted digests, never the value; each logged field holding
    the value in a form the runner knows is logged as the marker whole, and a field is cut to
    its logged length only after that (a key placed across the cut is still found)."""
    proxy = _proxy()
    redact = Redactor({"API_KEY": KEY}).proxy_rules()
    assert redact is not None and holding(json.dumps(redact).encode()) == []
    proxy.Rules._parse({"lease": "L1", "allow": [], "redact": redact})
    raw = KEY.encode()
    targets = [
        f"http://api.test/{KEY}",
        f"{KEY}.example:443",
        "http://api.test/?k=" + "".join(f"%{b:02x}" for b in raw),
        "http://api.test/" + raw.hex().upper(),
        "http://api.test/" + base64.urlsafe_b64encode(b"ab" + raw).decode(),
        "http://api.test/" + urllib.parse.quote(base64.b64encode(b"a" + raw), safe=""),
        "http://api.test/" + "a" * (proxy.TARGET_MAX - 30) + KEY,
        "http://api.test/%" + "".join(c if i % 3 else f"%{ord(c):02x}" for i, c in enumerate(KEY)),
    ]
    for i, target in enumerate(targets):
        proxy.log(id=i, lease="L1", event="request", method=KEY, target=target, client="10.0.0.2")
        proxy.log(id=i, lease="L1", event="refused", detail="not on the allowlist", host=target)
    proxy.log(id=99, lease="L2", event="request", method="GET", target=f"http://x/{KEY}")
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    mine = [x for x in lines if x.get("lease") == "L1" and "id" in x]
    assert [x.get("target", x.get("host")) for x in mine] == [MARK] * (2 * len(targets))
    assert all(x["method"] == MARK for x in mine if x["event"] == "request")
    assert holding(json.dumps(mine).encode()) == []
    # another lease without secrets is logged as it was, cut to its length
    other = next(x for x in lines if x.get("lease") == "L2" and "id" in x)
    assert other["target"] == f"http://x/{KEY}"


def _files(root: Path) -> dict[str, bytes]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


def _members(archive: Path) -> dict[str, bytes]:
    out = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            f = tar.extractfile(member) if member.isfile() else None
            if f is not None:
                out[member.name] = f.read()
    return out


def test_a_stray_percent_before_the_value_does_not_hide_it() -> None:
    """``%`` then a value that starts with hex digits, some of it percent-encoded: a decoder
    eats the stray ``%`` with the value's first two characters, and the rest is still found,
    by the runner and by the proxy."""
    value = "ab12cd-made-up-secret-value-0123"
    tail = "".join(c if i % 3 else f"%{ord(c):02X}" for i, c in enumerate(value) if i >= 2)
    target = f"http://api.test/x%{value[:2]}{tail}"
    redactor = Redactor({"K": value})
    assert redactor.found(target.encode()) == ["K"]
    assert value[2:] not in target and "[redacted: K]" in redactor.text(target)
    proxy = _proxy()
    redact = redactor.proxy_rules()
    proxy.Rules._parse({"lease": "L", "allow": [], "redact": redact})
    assert proxy.redacted("L", target) == "[redacted: K]"


# --- the same rules through the orchestrator, with the fake backend ------------------------


def _leaking_job(mounts: dict[str, Path]) -> None:
    """A job that puts the key in its transcript (base64), its evidence, a file whose name
    holds it and its result.json (a listed file and the summary)."""
    out = mounts["/job/output"]
    (out / "logs").mkdir(parents=True, exist_ok=True)
    key = KEY.encode()
    (out / "logs" / "stdout.log").write_text(
        json.dumps({"type": "assistant", "message": {"id": "m1", "content": []}}) + "\n"
        + json.dumps({"type": "user", "text": base64.b64encode(b"k=" + key).decode()}) + "\n"
        + json.dumps({"type": "result", "subtype": "success", "num_turns": 1}) + "\n"
    )  # fmt: skip
    (out / "logs" / "evaluation.log").write_text(json.dumps({"accuracy": 0.819, "k": KEY}))
    (out / f"{KEY}.txt").write_text("named after the key\n")
    (out / "notes.txt").write_text("nothing secret here\n")
    (out / "result.json").write_text(
        json.dumps(
            {
                "schemaVersion": "2.0",
                "status": "completed",
                "summary": f"done; my key is {KEY.encode().hex()}",
                "execution": {"status": "succeeded", "failure": None},
                "evidence": [
                    {"path": "logs/evaluation.log"},
                    {"path": f"{KEY}.txt"},
                    {"path": "notes.txt"},
                ],
                "experiment": {"commands": []},
                "workloadCompletion": [],
                "diagnosis": "scripted",
            }
        )
    )


def fake_agent_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, work: Callable[[dict[str, Path]], None]
) -> dict[str, Any]:
    """The scripted agent's job (its key API_KEY, this module's KEY) run on the fake backend
    through the orchestrator, its container doing ``work`` (given its mounts); the envelope."""
    from runner.backends.fake import FakeBackend, FakeJob
    from runner.execution import orchestrator
    from tests.unit.test_agents import _contract, scripted_options

    monkeypatch.setenv("RUNNER_TEST_AGENT_KEY", KEY)
    fake = FakeBackend()
    info = fake.add_image()
    fake.jobs = lambda spec: FakeJob(work=work)
    options = scripted_options(tmp_path, info.id)
    return orchestrator.as_json(orchestrator.run(_contract(tmp_path), options, backend=fake))


def test_files_holding_the_key_are_withheld_and_nothing_else_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No engine: the orchestrator's one redaction step. The transcript and every string of
    the envelope are redacted; the evidence, result.json and the file named after the key are
    kept as the job wrote them, named in the warnings and record/withheld.json, and left out of
    the export with why; a clean listed file is exported as it is."""
    env = fake_agent_run(tmp_path, monkeypatch, _leaking_job)
    job = Path(env["jobDir"])
    assert env["measurements"][0]["value"] == 0.819, env["failure"]
    assert holding(json.dumps(env).encode()) == []
    withheld = {f["path"] for f in json.loads((job / "record/withheld.json").read_text())["files"]}
    assert withheld == {"output/logs/evaluation.log", "output/result.json", f"output/{MARK}.txt"}
    assert sum("is withheld from export" in w for w in env["warnings"]) == 3, env["warnings"]
    kept = {"output/logs/evaluation.log", "output/result.json"}
    leaks = {n: f for n, d in _files(job).items() if n not in kept and (f := holding(d))}
    assert leaks == {}
    archive = tmp_path / "run.tar"
    exported = run_cli("export", str(job), "-o", str(archive))
    assert exported.returncode == 0, exported.stderr
    members = _members(archive)
    assert [n for n, d in members.items() if holding(d) or holding(n.encode())] == []
    assert any(m.endswith("data/output/notes.txt") for m in members)
    assert "output/result.json: is withheld" in exported.stdout + exported.stderr
    # a list of withheld files that cannot be read stops the export: what it names must stay
    (job / "record" / "withheld.json").write_text("{not json")
    refused = run_cli("export", str(job), "-o", str(tmp_path / "again.tar"))
    assert refused.returncode == 3 and "withheld.json" in refused.stderr, refused.stderr
    assert not (tmp_path / "again.tar").exists()


def test_encoded_forms_percent_encoded_again_are_found() -> None:
    """Base64 with ``+`` and ``/`` (as a URL carries them, ``%2B``/``%2F``; wrapped too) and
    hex percent-encoded: each character of a form may itself be percent-encoded."""
    value = "sk-~~~???>>>-made-up-value-0123"
    raw = value.encode()
    b64 = base64.b64encode(b"Q" + raw).decode()
    assert "+" in b64 and "/" in b64
    redactor = Redactor({"K": value})
    for data in (
        urllib.parse.quote(b64, safe=""),
        "\n".join(urllib.parse.quote(b64, safe="")[i : i + 11] for i in range(0, 200, 11)),
        "x%" + urllib.parse.quote(b64, safe=""),
        "".join(f"%{ord(c):02x}" for c in raw.hex()),
        "%" + raw.hex().upper(),
    ):
        assert redactor.found(data.encode()) == ["K"], data
        assert "[redacted: K]" in redactor.text(data), data
