"""The hostile review of issue 25's fixes (third round): each hole found, as a regression
test. The agent guard, the redaction step, the input cache and the tools they touch, attacked
as a hostile job, agent prompt, contract author and local user would."""

from __future__ import annotations

import base64

import pytest

from runner.redaction import REDACTED, Redactor
from tests.test_hostile_secrets import KEY, holding

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
