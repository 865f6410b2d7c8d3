"""The served client's wire format (runner.client): its request is byte for byte the
``json.dumps`` the server reads with ``json.loads``, and it reads the server's two answers
without ``json`` (the client imports neither ``json`` nor ``re``: tests/unit/test_startup.py).
Any text a command line, a folder or an environment can hold, lone surrogates included."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from runner.client import _answer, _request

TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
"""Every code point, lone surrogates too (a name that is not UTF-8 reaches Python so)."""


@given(
    argv=st.lists(TEXT, max_size=6),
    cwd=TEXT,
    env=st.dictionaries(TEXT, TEXT, max_size=6),
    code=TEXT,
    umask=st.integers(min_value=0, max_value=0o777),
)
def test_the_request_is_what_json_dumps_writes(
    argv: list[str], cwd: str, env: dict[str, str], code: str, umask: int
) -> None:
    request = {"argv": argv, "cwd": cwd, "env": env, "code": code, "umask": umask}
    sent = _request(argv, cwd, env, code, umask)
    assert sent == json.dumps(request).encode() + b"\n"
    assert json.loads(sent) == request and sent.count(b"\n") == 1


@given(st.integers(min_value=0, max_value=255))
def test_an_exit_code_is_read_as_json_writes_it(code: int) -> None:
    assert _answer(json.dumps({"exit": code}).encode() + b"\n") == (code, None)


@given(st.integers(min_value=-(2**63), max_value=2**63).filter(lambda n: not 0 <= n <= 255))
def test_an_exit_code_no_process_can_end_with_is_no_answer(code: int) -> None:
    """256 would end the client with 0, success, for a command the server never said ended
    so (hostile review, round 12)."""
    assert _answer(json.dumps({"exit": code}).encode() + b"\n") == (None, None)


@given(TEXT)
def test_a_stale_answer_is_read_as_json_writes_it(why: str) -> None:
    assert _answer(json.dumps({"stale": why}).encode() + b"\n") == (None, why)


@given(st.binary(max_size=64))
def test_anything_else_is_no_answer_and_never_raises(reply: bytes) -> None:
    """Hostile: a server that stopped halfway or answers nonsense is a server that stopped
    answering (exit 4, said), never a crash of the client or a made-up exit code."""
    exit_code, stale = _answer(reply)
    if exit_code is not None:
        assert json.loads(reply) == {"exit": exit_code} and 0 <= exit_code <= 255
    if stale is not None:
        assert json.loads(reply) == {"stale": stale}


def test_answers_that_are_not_the_two_lines() -> None:
    for reply in (b"", b'{"exit": 0}', b'{"exit": }\n', b'{"exit": 1.5}\n', b'{"exit": "1"}\n',
                  b'{"exit": 1x}\n', b'{"exit":1}\n', b"\xff\n", b'{"stale": "a"b"}\n',
                  b'{"stale": "a\\q"}\n', b'{"exit": 1} \n', b'{"exit": 007}\n',
                  b'{"exit": -01}\n', b'{"exit": 00}\n', b'{"exit": -}\n'):  # fmt: skip
        assert _answer(reply) == (None, None), reply
