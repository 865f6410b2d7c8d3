"""The fourteenth hostile review (the egress allowlist, round 13's weaknesses), on the real
engine: where an allowed name may lead, and the counts of a job that floods the proxy's log.

The proxy connected to whatever address an allowed name resolved to, so whoever runs that
name's DNS could point it at this host's side of the network: a private range, loopback, a
cloud's metadata service. And past the cap on a lease's log, the proxy logged nothing more of
the lease: the envelope's counts stopped there, so a job could hide its later requests
behind a flood of refused ones. The tests of the proxy program alone (the lease a request is
served under, the tally line) are in tests/integration/test_egress_proxy.py."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_hostile_review_round3 import _small_log_proxy_image
from tests.support import SESSION_ID, SESSION_LABEL, json_measurement, run_job, write_contract
from tests.support.egress import Outside, left_behind, outside

pytestmark = [pytest.mark.hostile, pytest.mark.docker]

ALLOWED = "allowed.egress.test"
JOB_LABELS = {SESSION_LABEL: SESSION_ID, "egress-test": "round14"}

ASK = r"""
import json, sys, urllib.error, urllib.request
allowed, refused = sys.argv[1], int(sys.argv[2])
opener = urllib.request.build_opener(urllib.request.ProxyHandler())
codes = []
for i in range(refused):
    try:
        opener.open(f"http://refused-{i}.egress.test:8000/" + "p" * 200, timeout=20)
    except urllib.error.HTTPError as exc:
        codes.append(exc.code)
for i in range(3):
    try:
        codes.append(opener.open(f"http://{allowed}/", timeout=20).status)
    except urllib.error.HTTPError as exc:
        codes.append(exc.code)
json.dump({"codes": codes}, open("/job/output/asked.json", "w"))
"""


@pytest.fixture
def the_outside() -> Iterator[Outside]:
    labels = {SESSION_LABEL: SESSION_ID, "egress-test": "round14-outside"}
    with outside(labels, {ALLOWED: "allowed"}, JOB_LABELS) as net:
        yield net


def _run(tmp_path: Path, image_id: str, net: Outside, grant: dict[str, Any], refused: int) -> Any:
    policy = tmp_path / "policy.json"
    egress = {"allow": [net.pair(ALLOWED)], "upstreamNetwork": net.network, **grant}
    policy.write_text(json.dumps({"acceptUnsigned": True, "egress": egress}))
    contract = write_contract(
        tmp_path, image_id, command=["python3", "-c", ASK, net.pair(ALLOWED), str(refused)],
        environment={"egress": [net.pair(ALLOWED)]},
        measurements=[json_measurement("asked.json", "/codes/0")],
    )  # fmt: skip
    code, envelope, err = run_job(
        contract, tmp_path / "state", "--policy", str(policy), "--label", "egress-test=round14"
    )
    assert code == 0, (envelope.get("failure"), err[-3000:])
    asked = json.loads((Path(envelope["jobDir"]) / "output" / "asked.json").read_text())
    return envelope, asked["codes"]


def test_an_allowed_name_that_resolves_into_a_private_range_is_not_reached(
    tmp_path: Path, image_id: str, the_outside: Outside
) -> None:
    """The allowed name resolves (through the upstream network's DNS) to a private address,
    and the policy names no private range: refused, and the envelope says why. Before: the
    proxy connected, and the job got the host's answer."""
    net = the_outside
    envelope, codes = _run(tmp_path, image_id, net, {}, 0)
    assert codes == [403, 403, 403]
    egress = envelope["egress"]
    assert egress["privateNetworks"] == [] and egress["allowed"] == 0 and egress["refused"] == 3
    for c in egress["connections"]:
        why, _, address = c["detail"].rpartition(" ")
        assert why == "resolves to a non-public address:" and c["address"] is None, c
        assert ipaddress.ip_address(address) in ipaddress.ip_network(net.subnet), c
    assert left_behind(JOB_LABELS) == {"containers": [], "networks": []}


def test_a_flood_of_refused_requests_hides_no_later_request_from_the_counts(
    tmp_path: Path, image_id: str, the_outside: Outside
) -> None:
    """Each lease logs at most 2 KiB here (a test build of the proxy): 40 refused requests
    fill it, then 3 allowed ones go unlisted. Before: the envelope counted what was listed
    (no allowed connection at all). Now the proxy's tally counts them all, and the allowed
    ones say where they went."""
    net = the_outside
    grant = {"privateNetworks": [net.subnet], "proxyImage": _small_log_proxy_image()}
    envelope, codes = _run(tmp_path, image_id, net, grant, 40)
    assert codes == [403] * 40 + [200] * 3
    egress = envelope["egress"]
    assert egress["logTruncated"] and egress["problems"] == [], egress
    assert (egress["allowed"], egress["refused"], egress["incomplete"]) == (3, 40, 0), egress
    assert len(egress["connections"]) < 43
    log = (Path(envelope["jobDir"]) / egress["log"]).read_text()
    assert log.count('"event":"tally"') == 1
    assert left_behind(JOB_LABELS) == {"containers": [], "networks": []}
