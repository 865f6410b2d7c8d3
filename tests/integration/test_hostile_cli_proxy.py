"""Regression tests for issue 25's items 8 to 10: one meaning per key flag (``--trusted-keys``
names issuer keys on every command; result signers are ``--result-keys``) and
``runner verify-result`` re-parsing each value from its evidence; the egress proxy refusing the
header lines RFC 9112 says to refuse; ``runner cleanup`` acting on one state folder only.

The verify-result and cleanup cases use the real engine (a toy run, real egress slots); the
proxy's cases run the proxy program itself on loopback, as
tests/integration/test_egress_proxy.py does, with its fixture.

The one that needs neither is in tests/unit/test_hostile_cli_proxy.py.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner import backends
from runner.backends.types import EgressPlan, HostPort
from runner.egress import slots as egress
from runner.egress.proxylog import read_log
from runner.models.envelope import ParserRef, ResultEnvelope
from runner.results import attest
from tests.integration.test_egress_proxy import Proxy, proxy  # noqa: F401 - the proxy fixture
from tests.support import SESSION_ID, SESSION_LABEL, docker, run_cli, run_job, write_contract
from tests.support.egress import outside

SESSION = {SESSION_LABEL: SESSION_ID}


# -------------------------------------------------- 8. one meaning per flag; values re-parsed


@pytest.fixture(scope="module")
def toy_job(tmp_path_factory: pytest.TempPathFactory, image_id: str) -> Path:
    """One toy run (toy-accuracy 0.819, read from output/logs/evaluation.log); each test
    works on its own copy of the job folder."""
    tmp = tmp_path_factory.mktemp("toy")
    code, env, err = run_job(write_contract(tmp, image_id), tmp / "state")
    assert code == 0, (env.get("failure"), err)
    return Path(env["jobDir"])


@pytest.fixture
def job(toy_job: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "job"
    shutil.copytree(toy_job, copy, symlinks=True)
    return copy


def _host_runner_key() -> Path:
    return Path(os.environ["RUNNER_CONFIG_DIR"]) / "runner-key" / "runner.key"


def _issuer(tmp_path: Path) -> tuple[Path, Path]:
    """A fresh issuer key, trusted (as issuers are, `runner trust --trusted-keys`) in a
    folder of its own: (its private key, the trusted issuer keys folder)."""
    assert run_cli("keygen", "--out", str(tmp_path / "issuer")).returncode == 0
    folder = tmp_path / "issuers"
    trusted = run_cli("trust", str(tmp_path / "issuer.pub"), "--trusted-keys", str(folder))
    assert trusted.returncode == 0, trusted.stderr
    return tmp_path / "issuer.key", folder


def _resign(job: Path, key: Path, value: float | None = None, parser: str | None = None) -> None:
    """Sign the job's result again with ``key``, its toy-accuracy first set to ``value``
    and recorded as read by ``parser`` (None: unchanged), as a forger holding that key
    would."""
    envelope = ResultEnvelope.model_validate_json((job / "result.json").read_bytes())
    (m,) = envelope.measurements
    if value is not None:
        m = m.model_copy(update={"value": value})
    if parser is not None:
        m = m.model_copy(update={"parser": ParserRef(id=parser, version="1")})
    envelope.measurements[0] = m
    (job / "result.json").write_text(envelope.model_dump_json(indent=2) + "\n")
    attest.sign_result(envelope, job, key)


@pytest.mark.docker
@pytest.mark.hostile
def test_a_result_forged_with_the_issuer_key_does_not_verify(job: Path, tmp_path: Path) -> None:
    """A result with a made-up value, signed with the issuer's key: `verify-result
    --trusted-keys <issuer folder>` used to trust that folder for results and said ok. Now
    --trusted-keys is refused there (exit 2, naming --result-keys), and even with the issuer
    folder named as result keys the value fails: the evidence gives 0.819, not 0.919."""
    key, issuers = _issuer(tmp_path)
    _resign(job, key, 0.919)

    old = run_cli("verify-result", str(job), "--trusted-keys", str(issuers))
    assert old.returncode == 2, (old.stdout, old.stderr)
    assert "--result-keys" in old.stderr and "issuer" in old.stderr
    assert old.stdout == ""

    named = run_cli("verify-result", str(job), "--result-keys", str(issuers))
    assert named.returncode == 3, (named.stdout, named.stderr)
    assert "signature_invalid" in named.stderr
    assert "re-parses with" in named.stderr and "to 0.819" in named.stderr
    assert "toy-accuracy = 0.919" in named.stderr

    by_default = run_cli("verify-result", str(job))  # the host's runner keys: not the issuer's
    assert by_default.returncode == 3 and "trusted" in by_default.stderr

    # The same key, the true value: it verifies with the key named as a result key, so the
    # refusal above is the value's, not the flag's.
    _resign(job, key, 0.819)
    honest = run_cli("verify-result", str(job), "--result-keys", str(issuers), "--json")
    assert honest.returncode == 0, honest.stderr
    assert json.loads(honest.stdout)["measurements"] == {"toy-accuracy": 0.819}


@pytest.mark.docker
@pytest.mark.hostile
def test_verify_result_re_parses_each_value_from_the_evidence(job: Path) -> None:
    """Re-signed with a trusted runner key (this host's own), a value the evidence does not
    give fails verify-result (it used to verify: only signatures and hashes were checked); so
    does a result whose contract, which binds the parser's config, is taken away or
    swapped."""
    ok = run_cli("verify-result", str(job), "--json")
    assert ok.returncode == 0, ok.stderr
    _resign(job, _host_runner_key())  # the harness itself changes nothing that matters
    assert run_cli("verify-result", str(job)).returncode == 0

    _resign(job, _host_runner_key(), 0.5)
    bad = run_cli("verify-result", str(job))
    assert bad.returncode == 3, (bad.stdout, bad.stderr)
    assert "evaluation.log" in bad.stderr and "toy-accuracy = 0.5" in bad.stderr
    statement = run_cli("verify-result", str(job / "result.intoto.json"))
    assert statement.returncode == 3 and "re-parses with" in statement.stderr

    (m,) = ResultEnvelope.model_validate_json((job / "result.json").read_bytes()).measurements
    other = next(p for p in ("csv.cell", "json.scalar") if p != m.parser.id)
    _resign(job, _host_runner_key(), 0.819, parser=other)  # another parser than the contract's
    swapped_parser = run_cli("verify-result", str(job))
    assert swapped_parser.returncode == 3, swapped_parser.stdout
    assert "is not the contract's" in swapped_parser.stderr

    _resign(job, _host_runner_key(), 0.819, parser=m.parser.id)
    assert run_cli("verify-result", str(job)).returncode == 0
    contract = job / "input" / "task.json"
    raw = contract.read_bytes()
    contract.unlink()
    gone = run_cli("verify-result", str(job))
    assert gone.returncode == 3 and "task.json" in gone.stderr and "re-parse" in gone.stderr
    contract.symlink_to(tmp := job / "elsewhere.json")
    tmp.write_bytes(raw)
    linked = run_cli("verify-result", str(job))
    assert linked.returncode == 3 and "not a regular file" in linked.stderr
    contract.unlink()
    contract.write_bytes(raw.replace(b'"toy-accuracy"', b'"toy-accuracy2"', 1))
    swapped = run_cli("verify-result", str(job))
    assert swapped.returncode == 3 and "task.json" in swapped.stderr


@pytest.mark.docker
@pytest.mark.hostile
def test_verify_bundle_takes_each_flag_in_its_one_meaning(tmp_path: Path, image_id: str) -> None:
    """verify-bundle: --trusted-keys DIR names issuer keys (as on run), --result-keys DIR the
    keys that seal the bundle and sign the result. The issuer folder as result keys does not
    verify the runner's seal; `runner trust --result-keys` puts a runner key where
    --result-keys finds it."""
    key, issuers = _issuer(tmp_path)
    contract = write_contract(tmp_path, image_id)
    signed = run_cli("sign", str(contract), "--key", str(key), "--expires-in", "1h", "--json")
    assert signed.returncode == 0, signed.stderr
    envelope = Path(json.loads(signed.stdout)["envelope"])
    code, env, err = run_job(
        envelope, tmp_path / "state", "--trusted-keys", str(issuers), unsigned=False
    )
    assert code == 0, (env.get("failure"), err)
    archive = tmp_path / "run.bag.tar"
    exported = run_cli("export", env["jobDir"], "-o", str(archive))
    assert exported.returncode == 0, exported.stderr
    runners = tmp_path / "runners"
    public = _host_runner_key().with_suffix(".pub")
    trusted = run_cli("trust", str(public), "--result-keys", str(runners), "--json")
    assert trusted.returncode == 0, trusted.stderr
    assert Path(json.loads(trusted.stdout)["trustedAs"]).parent == runners

    both = ["--trusted-keys", str(issuers), "--result-keys", str(runners), "--json"]
    ok = run_cli("verify-bundle", str(archive), *both)
    assert ok.returncode == 0, ok.stdout
    assert json.loads(ok.stdout)["valid"] is True

    swapped = ["--trusted-keys", str(runners), "--result-keys", str(issuers), "--json"]
    bad = run_cli("verify-bundle", str(archive), *swapped)
    assert bad.returncode == 3, bad.stdout
    problems = json.loads(bad.stdout)["problems"]
    assert any("bundle.intoto.json" in str(p) for p in problems), problems
    assert any("task.dsse.json" in str(p) for p in problems), problems


# ------------------------------------------------------- 9. header lines RFC 9112 refuses


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("head", "detail"),
    [
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nHost : other.test", "whitespace before"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nHost\t: other.test", "whitespace before"),
        (b"POST http://localhost:{up}/ HTTP/1.1\r\nContent-Length : 5", "whitespace before"),
        (b"POST http://localhost:{up}/ HTTP/1.1\r\nTransfer-Encoding : chunked", "whitespace"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nX-A: a\r\n Host: other.test", "folding"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nX-A: a\r\n\tb", "folding"),
        (b"CONNECT localhost:{up} HTTP/1.1\r\nX-A: a\r\n b", "folding"),
        (b"CONNECT localhost:{up} HTTP/1.1\r\nHost : other.test", "whitespace before"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nX(A): b", "no token"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nHo st: other.test", "no token"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\n: b", "no field name"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nX-A", "no field name"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nX-A: a\rHost: other.test", "CR, LF or NUL"),
        (b"POST http://localhost:{up}/ HTTP/1.1\r\nX-A: a\nContent-Length: 9", "CR, LF or NUL"),
        (b"GET http://localhost:{up}/ HTTP/1.1\r\nX-A: a\x00b", "CR, LF or NUL"),
    ],
)
def test_header_lines_rfc_9112_refuses_are_refused(
    proxy: Proxy,  # noqa: F811 - the fixture imported above
    head: bytes,
    detail: str,
) -> None:
    """Each used to be forwarded as it came (a second Host or a Content-Length the proxy
    never saw, for whatever reads it onward); now 400, logged, nothing sent onward."""
    got = proxy.ask(head.replace(b"{up}", str(proxy.upstream).encode()) + b"\r\n\r\n")
    assert got.split(b" ")[1] == b"400", got
    assert b"200" not in got
    [c] = read_log(proxy.log())
    assert c.decision == "refused" and c.detail.startswith("bad request: "), c
    assert detail in c.detail


@pytest.mark.hostile
@pytest.mark.parametrize(
    "line",
    [
        b"GET http://localhost:{up}/a\rb HTTP/1.1",  # a bare CR in the target
        b"GET http://localhost:{up}/ HTTP/1.1\rX-A:b",  # ... after the version
        b"G(T http://localhost:{up}/ HTTP/1.1",  # a method that is no token
        b"GET http://localhost:{up}/ HTTP/1.7",  # no HTTP/1 version there is
    ],
)
def test_a_request_line_with_a_bare_cr_or_no_token_is_refused(
    proxy: Proxy,  # noqa: F811
    line: bytes,
) -> None:
    got = proxy.ask(line.replace(b"{up}", str(proxy.upstream).encode()) + b"\r\n\r\n")
    assert got.split(b" ")[1] == b"400", got
    [c] = read_log(proxy.log())
    assert (c.decision, c.detail) == ("refused", "bad request")


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("fields", "status"),
    [
        (b"Content-Length: 3\r\nContent-Length: 4", b"400"),  # two values that differ
        (b"Content-Length: 3\r\nTransfer-Encoding: chunked", b"411"),  # both
        (b"Content-Length: +3", b"400"),  # no number
    ],
)
def test_what_the_proxy_already_refused_stays_refused(
    proxy: Proxy,  # noqa: F811
    fields: bytes,
    status: bytes,
) -> None:
    head = f"POST http://localhost:{proxy.upstream}/ HTTP/1.1\r\n".encode() + fields
    got = proxy.ask(head + b"\r\n\r\nabcd")
    assert got.split(b" ")[1] == status, got


@pytest.mark.hostile
def test_well_formed_fields_still_pass(proxy: Proxy) -> None:  # noqa: F811
    """A name of every token character, a value with a tab and spaces in it, the same
    Content-Length twice: forwarded as before."""
    got = proxy.ask(
        f"POST http://localhost:{proxy.upstream}/ok HTTP/1.1\r\n"
        "X-Odd_Name.1!#$%&'*+^`|~: a\tb  c\r\nContent-Length: 2\r\ncontent-length:2\r\n"
        "\r\nhi".encode()
    )
    assert got.startswith(b"HTTP/1.1 200 OK"), got
    seen = json.loads(got.split(b"\r\n\r\n", 1)[1])
    assert seen["body"] == "hi" and "a\tb  c" in seen["headers"]["x-odd_name.1!#$%&'*+^`|~"]


# --------------------------------------------------------- 10. cleanup of one state folder


def _slots_named(names: list[str]) -> dict[str, bool]:
    """Whether each slot's proxy is still on the engine."""
    have = docker("ps", "-a", "--format", "{{.Names}}").stdout.split()
    return {n: f"{n}-proxy" in have for n in names}


@pytest.fixture
def two_free_slots(tmp_path: Path) -> Iterator[tuple[Path, str, Path, str]]:
    """A real free slot (network, proxy, namespace holder) in each of two state folders, as
    an attempt leaves its slot behind: (state A, its slot, state B, its slot)."""
    with outside(SESSION, {}, runs=SESSION) as net:
        plan = EgressPlan(
            (HostPort("api.example", 443),), net.network, "runner-proxy:local", (net.subnet,)
        )
        backend = backends.default()
        made = []
        for name in ("a", "b"):
            state = tmp_path / f"state-{name}"
            eg = egress.lease(backend, plan, f"runner-cleanup-{name}-a1", state, labels=SESSION)
            egress.release(eg)
            made += [state, eg.slot]
        yield made[0], made[1], made[2], made[3]


@pytest.mark.docker
@pytest.mark.hostile
def test_cleanup_of_one_state_folder_leaves_anothers_slot(
    two_free_slots: tuple[Path, str, Path, str],
) -> None:
    """`runner cleanup` used to remove every free slot on the engine, whatever folder made
    it, and its --dry-run listed them all as "removed". Now --state-dir A: a dry run removes
    nothing and lists A's slot alone, as "would remove"; the cleanup removes A's slot and
    leaves B's."""
    a, slot_a, b, slot_b = two_free_slots
    assert _slots_named([slot_a, slot_b]) == {slot_a: True, slot_b: True}

    dry = run_cli("cleanup", "--state-dir", str(a), "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert report["dryRun"] is True and "removed" not in report
    assert report["stateDir"] == str(a.resolve())
    assert [x["name"] for x in report["wouldRemove"]] == [slot_a]
    assert _slots_named([slot_a, slot_b]) == {slot_a: True, slot_b: True}

    text = run_cli("cleanup", "--state-dir", str(a), "--dry-run")
    assert text.returncode == 0, text.stderr
    assert f"would remove  {slot_a}" in text.stdout and slot_b not in text.stdout
    assert not [line for line in text.stdout.splitlines() if line.startswith("removed")]
    assert "dry run: nothing was removed" in text.stdout

    done = run_cli("cleanup", "--state-dir", str(a), "--json")
    assert done.returncode == 0, done.stderr
    assert [x["name"] for x in json.loads(done.stdout)["removed"]] == [slot_a]
    assert _slots_named([slot_a, slot_b]) == {slot_a: False, slot_b: True}
    net = docker("network", "ls", "--format", "{{.Name}}").stdout.split()
    assert f"{slot_a}-net" not in net and f"{slot_b}-net" in net

    other = run_cli("cleanup", "--json", env={"RUNNER_STATE_DIR": str(b)})  # the default
    assert other.returncode == 0, other.stderr
    assert [x["name"] for x in json.loads(other.stdout)["removed"]] == [slot_b]
    assert _slots_named([slot_b]) == {slot_b: False}
