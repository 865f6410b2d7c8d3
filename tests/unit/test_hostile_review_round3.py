"""The hostile review of issue 25's fixes (third round): each hole found, as a regression
test. The agent guard, the redaction step, the input cache and the tools they touch, attacked
as a hostile job, agent prompt, contract author and local user would."""

from __future__ import annotations

import base64
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from runner.agents import transcript
from runner.core.redaction import REDACTED, Redactor
from tests.integration.test_hostile_agent_guard import _answers, _policy, _short
from tests.support import docker, run_job, session_containers
from tests.support.agents import agent_contract, model_server
from tests.support.hostile import record
from tests.unit.test_hostile_secrets import KEY, holding

MARK = REDACTED.format(name="API_KEY")

# --- redaction: what the prefilter must not hide, and hex as xxd prints it -----------------


def _encoded(before: bytes) -> dict[str, bytes]:
    raw = before + KEY.encode()
    hexed = raw.hex()
    return {
        "url": "".join(f"%{b:02x}" for b in raw).encode(),
        "url-mixed": b"".join(
            f"%{b:02X}".encode() if i % 2 else bytes([b]) for i, b in enumerate(raw)
        ),
        "hex-mixed-case": "".join(c.upper() if i % 3 else c for i, c in enumerate(hexed)).encode(),
        "base64-wrapped": base64.encodebytes(raw * 3),
        "xxd -p": "\n".join(hexed[i : i + 60] for i in range(0, len(hexed), 60)).encode(),
        "xxd -p, CRLF": "\r\n".join(hexed[i : i + 60] for i in range(0, len(hexed), 60)).encode(),
    }


@pytest.mark.hostile
@pytest.mark.parametrize("stray", [b"%\r", b"x%\r\r", b"%\r \t"], ids=["pct-cr", "cr-cr", "cr-ws"])
def test_a_stray_percent_and_carriage_return_does_not_hide_the_value(stray: bytes) -> None:
    """Before: the prefilter percent-decoded with quoted-printable's decoder, which drops
    everything after "=" and a lone CR; a "%\\r" anywhere before the value (one in a whole
    1 MiB read) hid every percent-encoded, mixed-case hex or wrapped base64 form of it that
    followed, and the value went into the file (a transcript, the bundle) in clear."""
    redactor = Redactor({"API_KEY": KEY})
    for before in (b"", b"a", b"ab"):
        for name, form in _encoded(before).items():
            data = stray + b" some log text " + form + b" done\n"
            assert redactor.found(data) == ["API_KEY"], (name, data)
            out = redactor.bytes(data)
            assert holding(out) == [] and MARK.encode() in out, (name, out)


@pytest.mark.hostile
def test_hex_wrapped_as_xxd_prints_it_is_found() -> None:
    """Before: hex was found only on one line; ``xxd -p`` (60 digits a line) of the key, as an
    agent's tool prints it into its transcript, was kept whole."""
    redactor = Redactor({"API_KEY": KEY})
    hexed = ("== " + KEY + " ==").encode().hex()
    for width in (60, 32, 7):
        text = "\n".join(hexed[i : i + width] for i in range(0, len(hexed), width)).encode()
        assert redactor.found(text) == ["API_KEY"], width
        out = redactor.bytes(text)
        assert MARK.encode() in out, width
        assert KEY.encode().hex().encode() not in out.replace(b"\n", b""), width


# --- the guard: the proxy's count past the cap on its lease's log --------------------------

_FLOOD = r"""
import os, socket, sys
host, port = os.environ["HTTP_PROXY"].removeprefix("http://").rstrip("/").split(":")

def ask(target):
    s = socket.create_connection((host, int(port)), timeout=20)
    s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    while s.recv(65536):
        pass
    s.close()

for i in range(12):  # refused: each is two lines of the proxy's log, past its cap
    ask(f"http://refused-{i}.test/" + "p" * 100)
for i in range(8):  # the model's host: each at least one turn
    ask(f"http://{sys.argv[1]}/v1/ping")
"""


def _small_log_proxy_image() -> str:
    """The checkout's proxy with a 2 KiB cap on each lease's log (built once, offline)."""
    from tests.unit.test_hostile_secrets import _checkout_proxy_image

    base = _checkout_proxy_image()
    tag = base + "-log2k"
    if docker("image", "inspect", tag).returncode != 0:
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "Dockerfile").write_text(
                f"FROM {base}\nENV EGRESS_LEASE_LOG_BYTES=2048\n"
            )
            built = docker("build", "--network", "none", "-q", "-t", tag, folder)
            assert built.returncode == 0, built.stderr
    return tag


@pytest.mark.docker
@pytest.mark.hostile
def test_a_job_that_floods_the_proxys_log_past_its_cap_is_stopped(
    tmp_path: Path, scripted_agent_image: str
) -> None:
    """Before: past the cap on its lease's log the proxy logs nothing more of the lease, and
    the runner's live count of model requests stopped there: a job that first filled the log
    with refused requests made its model requests uncounted (each turn here makes eight, and
    it ran until its answers alone passed maxTurns). Now a capped lease's log fails the guard
    closed (agent.transcript), naming why."""
    (tmp_path / "repository").mkdir()
    (tmp_path / "repository" / "flood.py").write_text(_FLOOD)
    with model_server(tmp_path, "evaluate") as server:
        allowed = f"{server.host}:{server.port}"
        prompt = f"repeat: python3 repository/flood.py {allowed}\npause: 0.5\nignore-limits: yes\n"
        contract = agent_contract(tmp_path, prompt=prompt, agent={"maxTurns": 20}, change=_short)
        policy = _policy(
            tmp_path,
            scripted_agent_image,
            allow=[allowed],
            egress={"upstreamNetwork": server.network, "proxyImage": _small_log_proxy_image()},
        )
        code, env, err = run_job(contract, tmp_path / "state", *policy)
        served = len(server.requests())
    record("proxy-log-flooded-past-its-cap", "runc", env, served=served)
    job = Path(env["jobDir"])
    answers = _answers(job / "record" / "attempts" / "1" / "transcript.jsonl")
    usage: dict[str, Any] = env["agentUsage"]
    assert code == 1, (env.get("failure"), err)
    assert env["failure"]["category"] == "resource_exhausted", env["failure"]
    assert usage["attempts"][0]["stoppedFor"] == "agent.transcript", (usage, answers, served)
    assert "proxy" in env["failure"]["reason"] and "cap" in env["failure"]["reason"], env
    assert answers <= 12, (answers, served)  # before: until its answers passed 20
    assert not session_containers()


# --- the guard: bytes written into the runtime's own stdout ---------------------------------


def test_junk_before_each_answer_fails_the_reader_closed() -> None:
    """Before: a line that did not parse was skipped, so bytes without a line break written
    into the runtime's stdout just before each of its lines hid every answer (no turn, no
    token counted, nothing said). Now a line that is no JSON object fails the guard closed;
    only the first line after a restart (a stream that may begin inside a line) is not
    judged."""
    answer = b'{"type": "assistant", "message": {"id": "m%d", "usage": {"output_tokens": 9}}}\n'
    reader = transcript.Reader(transcript.Prices(output=1.0))
    for i in range(5):
        reader.feed(b"xxxx" + answer % i)
    usage = reader.usage()
    assert usage.turns == 0  # the answers are hidden ...
    assert usage.tampered and "no JSON object" in usage.tampered  # ... and that is said
    assert usage.over(3, None) == transcript.TAMPERED
    clean = transcript.Reader()
    clean.feed(answer % 1)
    clean.restart()
    clean.feed(b'ssage": {"id": "m1"}}\n' + answer % 2)
    assert clean.usage().tampered is None and clean.usage().turns == 2


# A background process of the job writes into the agent runtime's stdout (the container's,
# through /proc/1/fd/1: the same pipe the engine reads), a byte at a time and no line break,
# so that each line the runtime prints starts with junk and no longer parses.
_INJECT = (
    'preflight runtime: python3 -c "import json"\n'
    "preflight checkpoint: true\n"
    "run: sh -c 'while :; do printf x; sleep 0.002; done' "
    "</dev/null >/proc/1/fd/1 2>/dev/null &\n"
)


@pytest.mark.docker
@pytest.mark.hostile
def test_junk_written_into_the_runtimes_stdout_does_not_lift_max_turns(
    tmp_path: Path, scripted_agent_image: str
) -> None:
    """The job writes into its agent runtime's stdout (/proc/1/fd/1, the pipe the engine
    reads): a runtime whose model waits between its tool result and its next answer (Claude
    Code) has each answer hidden behind the junk. Before: nothing noticed (here the scripted
    runtime, with no such wait, was stopped at maxTurns by the answers the junk missed). Now
    the first line that is no JSON object stops the agent, agent.transcript, naming why."""
    prompt = _INJECT + "repeat: true\npause: 0.05\nignore-limits: yes\n"
    contract = agent_contract(tmp_path, prompt=prompt, agent={"maxTurns": 20}, change=_short)
    started = time.monotonic()
    code, env, err = run_job(contract, tmp_path / "state", *_policy(tmp_path, scripted_agent_image))
    took = time.monotonic() - started
    record("junk-in-the-runtimes-stdout", "runc", env, seconds=round(took, 1))
    usage: dict[str, Any] = env["agentUsage"]
    job = Path(env["jobDir"])
    answers = _answers(job / "record" / "attempts" / "1" / "transcript.jsonl")
    assert code == 1, (env.get("failure"), err, usage, answers)
    assert env["failure"]["category"] == "resource_exhausted", (env["failure"], usage, took)
    assert usage["attempts"][0]["stoppedFor"] == "agent.transcript", (usage, answers)
    assert "no JSON object" in env["failure"]["reason"], env["failure"]
    assert answers < 20 and took < 90, (answers, took)
    assert not session_containers()


# --- redaction through the engine: a stray "%\r" in the engine's log --------------------------

_STRAY = r"""
import os
key = os.environ["API_KEY"].encode()
with open("/proc/1/fd/2", "wb") as err:  # the container's stderr: the engine's log of it
    # a progress counter, each step ending in "\r": what follows is printed over it
    err.write(b"".join(b"%d%%\r" % i for i in range(101)))
    err.write(b"key=" + "".join(f"%{b:02x}" for b in key).encode() + b"\n")
"""


@pytest.mark.docker
@pytest.mark.hostile
def test_a_stray_percent_cr_in_the_engine_log_does_not_carry_the_key_out(
    tmp_path: Path, scripted_agent_image: str
) -> None:
    """The agent writes a progress counter ("1%\\r2%\\r..."), then its key percent-encoded, into
    its container's stderr (the engine's log, kept as record/attempts/1/engine.log and
    exported). Before: the redaction prefilter's decoder dropped the rest of a line after
    "%\\r", so the key went into the record and the bundle in clear (engine.log, both).
    Now neither holds it in any form."""
    from tests.support import run_cli
    from tests.support.agents import SCRIPTED_ARGV, SCRIPTED_RUNTIME, agent_policy
    from tests.support.jobs import SESSION_ID, SESSION_LABEL
    from tests.unit.test_hostile_secrets import _files, _members

    (tmp_path / "repository").mkdir()
    (tmp_path / "repository" / "stray.py").write_text(_STRAY)
    prompt = (
        "preflight runtime: true\npreflight checkpoint: true\nrun: python3 repository/stray.py\n"
    )
    contract = agent_contract(tmp_path, prompt=prompt, agent={"maxTurns": 20}, change=_short)
    policy = agent_policy(
        tmp_path, "scripted", scripted_agent_image, argv=SCRIPTED_ARGV, usage="claude-code",
        secrets=[{"env": "API_KEY", "fromEnv": "AGENT_TEST_KEY"}], **SCRIPTED_RUNTIME,
    )  # fmt: skip
    state = tmp_path / "state"
    proc = run_cli(
        "run", str(contract), "--state-dir", str(state), "--json", "--allow-unsigned",
        "--label", f"{SESSION_LABEL}={SESSION_ID}", "--policy", str(policy),
        env={"AGENT_TEST_KEY": KEY},
    )  # fmt: skip
    env: dict[str, Any] = json.loads(proc.stdout)
    job = Path(env["jobDir"])
    engine_log = (job / "record" / "attempts" / "1" / "engine.log").read_bytes()
    assert b"99%\r100%\r" in engine_log, engine_log[-400:]  # the job's bytes got there
    archive = tmp_path / "run.tar"
    exported = run_cli("export", str(job), "-o", str(archive))
    assert exported.returncode == 0, exported.stderr
    leaks = {f"state/{n}": f for n, d in _files(state).items() if (f := holding(d))}
    leaks |= {f"bundle/{n}": f for n, d in _members(archive).items() if (f := holding(d))}
    assert leaks == {}
    assert MARK.encode() in engine_log
    assert not session_containers()


# --- redaction after a reattach: secrets unset or rotated meanwhile --------------------------


@pytest.mark.docker
@pytest.mark.hostile
@pytest.mark.parametrize("then", ["unset", "rotated"])
def test_a_reattach_that_cannot_know_the_secret_keeps_and_exports_none_of_it(
    tmp_path: Path, scripted_agent_image: str, then: str
) -> None:
    """The agent prints its key each turn; the runner is killed (SIGKILL) mid-job, then the
    variable the secret comes from is unset, or holds a new key, when `runner run` picks the
    attempt up again. Before: the reattach read the secret again and redacted nothing (unset)
    or the new key (rotated), so the transcript, stdout.log and the engine's log in the job
    folder, and the bundle, held the key the container had. Now the attempt's start records
    a salted digest of each secret; a reattach that cannot show it holds the same values
    replaces the attempt's streams and logs by a note, warns in the envelope, and the run
    cannot be exported."""
    from runner.contract import Trust, load_contract
    from runner.planning.plan import default_job_id
    from tests.support import run_cli, start_job
    from tests.support.agents import SCRIPTED_ARGV, SCRIPTED_RUNTIME, agent_policy
    from tests.unit.test_hostile_secrets import _files

    prompt = "repeat: echo key=$API_KEY\npause: 0.3\n"
    contract = agent_contract(tmp_path, prompt=prompt, agent={"maxTurns": 12}, change=_short)
    policy = agent_policy(
        tmp_path, "scripted", scripted_agent_image, argv=SCRIPTED_ARGV, usage="claude-code",
        secrets=[{"env": "API_KEY", "fromEnv": "AGENT_TEST_KEY"}], **SCRIPTED_RUNTIME,
    )  # fmt: skip
    state = tmp_path / "state"
    job = state / "jobs" / default_job_id(load_contract(contract, Trust()))
    live = job / "record" / "attempts" / "1" / "transcript.jsonl"
    proc = start_job(contract, state, "--policy", str(policy), env={"AGENT_TEST_KEY": KEY})
    try:
        deadline = time.monotonic() + 120
        while not (live.exists() and _answers(live) >= 3):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the agent took no turns"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    env = {"AGENT_TEST_KEY": "sk-rotated-" + "r" * 32} if then == "rotated" else {}
    _code, envelope, err = run_job(contract, state, "--policy", str(policy), env=env)
    record(f"reattach-secret-{then}", "runc", envelope)
    usage = envelope["agentUsage"]
    assert [a["attempt"] for a in usage["attempts"]] == [1], (usage, err)  # reattached
    leaks = {n: f for n, d in _files(state).items() if (f := holding(d))}
    assert leaks == {}, leaks  # before: the transcript, stdout.log, engine.log
    assert any("cannot be exported" in w for w in envelope["warnings"]), envelope["warnings"]
    assert b"withheld by the runner" in (job / "output" / "logs" / "stdout.log").read_bytes()
    exported = run_cli("export", str(job), "-o", str(tmp_path / "run.tar"))
    assert exported.returncode != 0 and "cannot be exported" in exported.stderr, exported
    assert not (tmp_path / "run.tar").exists()
    # a re-grade, under the secret as it is now, does not make the run exportable again
    regraded = run_cli("parse", str(job), "--policy", str(policy), "--json",
                       env={"AGENT_TEST_KEY": "sk-now-" + "n" * 32})  # fmt: skip
    assert json.loads(regraded.stdout)["revision"] == 2, regraded.stderr  # exit 1: maxTurns
    again = run_cli("export", str(job), "-o", str(tmp_path / "run.tar"))
    assert again.returncode != 0 and "cannot be exported" in again.stderr, again
    assert not session_containers()


# --- the guard: an over-long line in the runtime's stdout -------------------------------------


def test_an_answer_merged_into_a_line_over_a_mib_is_counted_or_fails_closed() -> None:
    """Before: a line over 1 MiB was skipped without a word, so a job writing 1 MiB + 1
    bytes (no line break) into the runtime's stdout before each answer hid every answer.
    Now lines up to 16 MiB are read (junk before an answer: no JSON object, fail closed), a
    longer one fails the guard closed, naming why without quoting it; only a restarted
    stream's first line is not judged."""
    answer = b'{"type": "assistant", "message": {"id": "m%d", "usage": {"output_tokens": 9}}}\n'
    old_cap = 1024 * 1024
    merged = transcript.Reader()
    for i in range(3):
        merged.feed(b"x" * (old_cap + 1) + answer % i)
    usage = merged.usage()
    assert usage.tampered and "no JSON object" in usage.tampered, usage
    assert usage.over(10, None) == transcript.TAMPERED
    big = transcript.Reader()  # a long line a runtime could print: read, counted
    pad = b"p" * (4 * old_cap)
    big.feed(b'{"type": "assistant", "message": {"id": "m1", "pad": "' + pad + b'"}}\n')
    assert big.usage().turns == 1 and big.usage().tampered is None
    over = transcript.Reader()
    for _ in range(transcript.LINE_MAX // old_cap + 1):
        over.feed(b"x" * old_cap)  # in pieces, as a stream comes
    over.feed(b"\n" + answer % 9)
    usage = over.usage()
    assert usage.tampered and "over 16 MiB" in usage.tampered and "xxx" not in usage.tampered
    assert usage.turns == 1 and usage.over(10, None) == transcript.TAMPERED
    restarted = transcript.Reader()
    restarted.restart()  # may begin inside a line: its first is not judged
    restarted.feed(b"x" * (transcript.LINE_MAX + 1) + b"\n" + answer % 1)
    assert restarted.usage().tampered is None and restarted.usage().turns == 1


_LONG_LINES = r"""
import json, resource, sys
from runner.agents import transcript

def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

unit = {"text": b"i", "lists": b"[],", "strings": b'"ab",'}[sys.argv[1]]
step = 1024 * 1024
body = unit * (step // len(unit))
reader = transcript.Reader()
reader.feed(b'{"type": "assistant", "message": {"id": "warm"}}\n')
base = rss()
for i in range(6):  # lines just under the cap, fed as a stream comes, a MiB a time
    if unit == b"i":  # a distinct id of almost 16 MiB
        reader.feed(b'{"type": "assistant", "message": {"id": "%d' % i)
    else:  # an answer with a value of 16 MiB of tiny JSON values
        reader.feed(b'{"type": "assistant", "message": {"id": "%d"}, "x": [' % i)
    for _ in range(transcript.LINE_MAX // step - 1):
        reader.feed(body)
    reader.feed(b'"}}\n' if unit == b"i" else b"0]}\n")
for _ in range(2):  # and lines past the cap
    for _ in range(transcript.LINE_MAX // step + 2):
        reader.feed(body)
    reader.feed(b"\n")
usage = reader.usage()
print(json.dumps({"turns": usage.turns, "grew": rss() - base, "tampered": usage.tampered}))
"""


@pytest.mark.parametrize("lines", ["text", "lists", "strings"])
def test_the_readers_memory_stays_bounded_with_lines_up_to_its_cap(lines: str) -> None:
    """Lines up to the 16 MiB cap are kept whole to be read: a fresh process feeding distinct
    ids just under the cap, or lines of as many tiny JSON values (parsed, each would be a
    Python object: hundreds of MB; a line over 1 MiB with more than 100,000 values fails
    closed), then lines past the cap, grows its peak RSS by under 100 MB (issue 25, item
    3's bound)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _LONG_LINES, lines], capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    record(f"transcript-reader-long-lines-{lines}", "none", {}, **got)
    assert got["turns"] == (7 if lines == "text" else 1) and got["tampered"], got
    if lines != "text":
        assert "100,000 JSON values" in got["tampered"], got
    assert got["grew"] < 100 * 1024 * 1024, got


_LONG_JUNK = """
import os
fd = os.open("/proc/1/fd/1", os.O_WRONLY)  # the container's stdout: the runtime's stream
junk = memoryview(b"x" * (1024 * 1024 + 1))  # no line break: the runtime's next line joins it
while junk:
    junk = junk[os.write(fd, junk) :]
"""


@pytest.mark.docker
@pytest.mark.hostile
def test_junk_over_a_mib_before_the_runtimes_lines_is_not_skipped(
    tmp_path: Path, scripted_agent_image: str
) -> None:
    """Each turn's command writes 1 MiB + 1 bytes without a line break into the runtime's
    stdout, so the next line it prints (here the tool's result; with Claude Code, whose
    model answers after a wait, the answer) joins a line over 1 MiB. Before: such a line was
    skipped without a word (here the agent ran on to maxTurns, agent.maxTurns, every result
    line hidden; an answer in it would not have been counted). Now the line is read (up to
    16 MiB), is no JSON object, and the agent is stopped, agent.transcript, naming why.
    (Through Docker the hole was also closed by chance: the engine's 1 MiB log file rotates
    inside such a line and the runner's stream of it lost a part, so a shorter piece was
    judged; the reader's own test above fails before the fix whatever the engine does.)"""
    (tmp_path / "repository").mkdir()
    (tmp_path / "repository" / "junk.py").write_text(_LONG_JUNK)
    prompt = (
        'preflight runtime: python3 -c "import json"\npreflight checkpoint: true\n'
        "repeat: python3 repository/junk.py\npause: 0.2\nignore-limits: yes\n"
    )
    contract = agent_contract(tmp_path, prompt=prompt, agent={"maxTurns": 8}, change=_short)
    started = time.monotonic()
    code, env, err = run_job(contract, tmp_path / "state", *_policy(tmp_path, scripted_agent_image))
    took = time.monotonic() - started
    record("long-junk-in-the-runtimes-stdout", "runc", env, seconds=round(took, 1))
    usage: dict[str, Any] = env["agentUsage"]
    assert code == 1, (env.get("failure"), err, usage)
    assert env["failure"]["category"] == "resource_exhausted", (env["failure"], usage, took)
    assert usage["attempts"][0]["stoppedFor"] == "agent.transcript", usage
    reason = env["failure"]["reason"]
    assert "no JSON object" in reason, reason
    assert "xxxx" not in reason and took < 90, (reason, took)
    assert not session_containers()


# --- the working copy: a cached file changed after the stamp check --------------------------


def test_a_cached_file_changed_before_the_working_copy_is_refused(tmp_path: Path) -> None:
    """The input cache's files are linked into input/ after their stamps are checked; a local
    user edits one then (same size, mtime put back), so the job's working copy
    (workspace/repository) gets the edited code, and restores it before the run ends, so the
    re-hash of input/ after the job passes. Before: the copy was made unchecked and the run
    `succeeded` on the edited code. Now the copy hashes what it copies against the listing
    of input/ as staged: input_digest_mismatch, naming the file, nothing left in workspace/."""
    from runner.caches import inputcache
    from runner.caches.inputcache import InputCache
    from runner.contract import load_contract
    from runner.core.errors import InputDigestMismatch
    from runner.execution import layout
    from runner.staging import jobdir as staging
    from runner.staging.jobdir import StateDir
    from tests.integration.test_hostile_inputs_round3 import _swap, _value_contract

    contract = load_contract(_value_contract(tmp_path / "c", "sha256:" + "ab" * 32))
    state = StateDir(tmp_path / "state")
    cache = InputCache.of_state(state.root)
    cases = (("edited", "change"), ("added", "add"), ("linked", "link"), ("clean", None))
    for name, tamper in cases:
        job = staging.prepare(state.job(name).root)
        staging.stage_inputs(job, contract, via=inputcache.stager(cache, job))
        value = job.input / "repository" / "value.txt"
        if tamper == "change":
            _swap(value, b"0.9\n")  # the cached inode: in every job that links it
        elif tamper == "add":
            os.chmod(value.parent, 0o700)
            (value.parent / "extra.py").write_text("print('not staged')\n")
        elif tamper == "link":
            os.chmod(value.parent, 0o700)
            (value.parent / "extra.py").symlink_to("value.txt")
        if tamper is None:
            assert layout.working_copy(job, contract, 1 << 40)
            assert (job.workspace / "repository" / "value.txt").read_text() == "0.1\n"
            continue
        with pytest.raises(InputDigestMismatch, match=r"repository\.path.*input/repository/"):
            layout.working_copy(job, contract, 1 << 40)
        assert list(job.workspace.iterdir()) == [], name
        if tamper == "change":
            _swap(value, b"0.1\n")  # put back: as a user covering the change would
        else:
            (value.parent / "extra.py").unlink()


# --- the re-hash of input/ after the job: its listing unreadable ------------------------------


def test_an_unreadable_listing_of_the_staged_inputs_fails_the_check_closed(
    tmp_path: Path,
) -> None:
    """Before: record/input-tree.json missing or not the runner's listing made the re-hash
    of input/ after the job return unchanged=None, and the run went on (succeeded). Now it
    is unchanged=False, naming the file: the run is input_digest_mismatch (its inputs cannot
    be shown to be what the contract binds, so no value is a result)."""
    from runner.contract import load_contract
    from runner.staging import jobdir as staging
    from tests.integration.test_hostile_inputs_round3 import _value_contract

    contract = load_contract(_value_contract(tmp_path / "c", "sha256:" + "ab" * 32))
    job = staging.prepare(tmp_path / "job")
    staging.stage_inputs(job, contract)
    assert staging.recheck_inputs(job).unchanged is True
    tree = job.record / "input-tree.json"
    good = tree.read_bytes()
    for broken in (b"", b"{}", b'{"listing": 7, "inputs": []}', None):
        if broken is None:
            tree.unlink()
        else:
            tree.write_bytes(broken)
        checked = staging.recheck_inputs(job)
        assert checked.unchanged is False, broken
        assert "record/input-tree.json" in str(checked.problem), checked
    tree.write_bytes(good)
    assert staging.recheck_inputs(job).unchanged is True


@pytest.mark.docker
@pytest.mark.hostile
def test_a_listing_removed_while_the_job_runs_ends_it_input_digest_mismatch(
    tmp_path: Path, image_id: str
) -> None:
    """A local user removes record/input-tree.json while the job runs. Before: the check of
    input/ after the job was skipped (inputsUnchanged null) and the run succeeded. Now it is
    input_digest_mismatch, exit 3, the reason naming the file."""
    from tests.integration.test_hostile_inputs_round3 import _value_contract
    from tests.support import start_job, wait_running

    contract = _value_contract(tmp_path / "c", image_id, pause="6")
    state = tmp_path / "state"
    proc = start_job(contract, state, "--job-id", "unlisted")
    wait_running(proc)
    (state / "jobs" / "unlisted" / "record" / "input-tree.json").unlink()
    out, err = proc.communicate(timeout=300)
    env: dict[str, Any] = json.loads(out)
    record("input listing removed during the job", "runc", env)
    assert proc.returncode == 3, (env.get("failure"), err)
    assert env["failure"]["category"] == "input_digest_mismatch", env["failure"]
    assert "record/input-tree.json" in env["failure"]["reason"], env["failure"]
    assert env["inputsUnchanged"] is False
    assert not session_containers()
