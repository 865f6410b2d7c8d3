"""runner/core/untrusted.py, the one reader of fields out of JSON of an untrusted shape (the
Kubernetes manifests' rules, an API server's answers, Podman's info): each wrong shape reads
as absent, never raises."""

from __future__ import annotations

from typing import Any

import pytest

from runner.core import untrusted

DOC: dict[str, Any] = {"spec": {"containers": [{"name": "job"}, "text"], "n": 3}}


@pytest.mark.parametrize(
    ("keys", "want"),
    [
        (("spec", "containers", 0, "name"), "job"),
        (("spec", "n"), 3),
        ((), DOC),
        (("spec", "containers", 2), None),  # past the end
        (("spec", "containers", -1), None),  # no counting from the end
        (("spec", "containers", 1, "name"), None),  # a string where an object was expected
        (("spec", 0), None),  # an object where an array was expected
        (("spec", "containers", "0"), None),  # an array where an object was expected
        (("spec", "n", "x"), None),  # a number
        (("missing", "deeper", 0), None),
    ],
)
def test_at_steps_only_through_the_expected_kinds(keys: tuple[str | int, ...], want: Any) -> None:
    assert untrusted.at(DOC, *keys) == want


@pytest.mark.parametrize("value", [None, 1, "x", True, [1], 2.5])
def test_mapping_is_empty_for_anything_not_an_object(value: Any) -> None:
    assert untrusted.mapping(value) == {}
    assert untrusted.mapping({"a": value}) == {"a": value}


@pytest.mark.parametrize("value", [None, 1, "x", {"a": 1}, 2.5])
def test_array_is_empty_for_anything_not_an_array(value: Any) -> None:
    assert untrusted.array(value) == []
    assert untrusted.array([value]) == [value]
