"""The fleet API client puts every id into its path as one quoted segment: an id a person
typed, or one a record carried, never reaches another path of the service."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from flotilla_ops.fleetapi import FleetApi, FleetEndpoints, _segment

ENDPOINTS = FleetEndpoints(
    policy_url="http://policy:1",
    audit_url="http://audit:2",
    dlq_url="http://dlq:3",
    executor_url="http://executor:4",
)
# Ids that would change the path if they went in as they are.
HOSTILE = ["a/b", "../../verify", "..", ".", "x?status=approved", "x#frag", "50%", "a b", "é/ü"]


@pytest.fixture
def seen() -> list[httpx.Request]:
    return []


@pytest.fixture
def api(seen: list[httpx.Request]) -> FleetApi:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"incidents": [], "entries": []})

    return FleetApi(ENDPOINTS, transport=httpx.MockTransport(answer))


CALLS: dict[str, tuple[Callable[[FleetApi, str], Any], str, str]] = {
    # name: (call, host, raw path with {} for the quoted id)
    "approval": (lambda a, i: a.approval("t", i), "policy", "/approvals/{}"),
    "approve": (lambda a, i: a.decide("t", i, approve=True, digest="d"), "policy", "/approvals/{}/approve"),
    "reject": (lambda a, i: a.decide("t", i, approve=False, digest="d"), "policy", "/approvals/{}/reject"),
    "timeline": (lambda a, i: a.timeline(i), "audit", "/incidents/{}/timeline"),
    "quarantined": (lambda a, i: a.quarantined(i), "dlq", "/quarantine/{}"),
    "requeue": (lambda a, i: a.requeue("t", i), "dlq", "/quarantine/{}/requeue"),
    "execution": (lambda a, i: a.execution(i), "executor", "/executions/{}"),
}


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("hostile", HOSTILE)
def test_an_id_is_one_segment_of_the_path_it_was_meant_for(
    api: FleetApi, seen: list[httpx.Request], name: str, hostile: str
) -> None:
    call, host, path = CALLS[name]
    call(api, hostile)
    (request,) = seen
    assert request.url.host == host
    raw = request.url.raw_path.decode("ascii").split("?", 1)
    prefix, _, suffix = path.partition("{}")
    assert raw[0].startswith(prefix) and raw[0].endswith(suffix), raw
    quoted = raw[0][len(prefix) : len(raw[0]) - len(suffix)]
    assert "/" not in quoted and "?" not in quoted and "#" not in quoted
    assert quoted not in (".", "..")
    assert httpx.URL(f"http://h/{quoted}").path == f"/{hostile}"  # the service reads back the id as given
    assert not request.url.fragment
    if name in ("approval", "quarantined", "execution"):
        assert len(raw) == 1, "no query smuggled in"


def test_an_ordinary_id_is_left_as_it_is(api: FleetApi, seen: list[httpx.Request]) -> None:
    api.approval("t", "9b2d7c1a-5e6f-4a3b-8c9d-0e1f2a3b4c5d")
    api.execution("scale:production/checkout-api:12:abc")
    assert seen[0].url.raw_path == b"/approvals/9b2d7c1a-5e6f-4a3b-8c9d-0e1f2a3b4c5d"
    assert seen[1].url.raw_path == b"/executions/scale%3Aproduction%2Fcheckout-api%3A12%3Aabc"


def test_segments() -> None:
    assert _segment("incident-204") == "incident-204"
    assert _segment("a.b") == "a.b"  # a dot inside a name is no dot segment
    assert _segment("..") == "%2E%2E"
    assert _segment("../x") == "..%2Fx"  # one segment named '..%2Fx': no traversal
    with pytest.raises(ValueError, match="empty"):
        _segment("")
