"""Envelope.caused(): causation, correlation, hop budget and trace context of a child record."""

from __future__ import annotations

import re
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flotilla.envelope import DEFAULT_HOPS, SPEC_VERSION, Envelope, child_traceparent
from tests.support.messages import sample_envelope

W3C = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"
PARENT_TP = f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"


def _parts(traceparent: str) -> tuple[str, str, str]:
    match = W3C.fullmatch(traceparent)
    assert match, traceparent
    return match.group(1), match.group(2), match.group(3)


def test_caused_links_the_child_to_itssample_envelope() -> None:
    parent = sample_envelope()
    child = parent.caused("dev.flotilla.incidents.DiagnosisRequested", "/agents/diagnostic")
    assert child.type == "dev.flotilla.incidents.DiagnosisRequested"
    assert child.source == "/agents/diagnostic"
    assert child.causationid == parent.id
    assert child.correlationid == parent.correlationid == "incident-204"
    assert child.hops == parent.hops - 1 == 6
    assert child.id != parent.id
    assert uuid.UUID(child.id).version == 4
    assert child.specversion == SPEC_VERSION


def test_caused_continues_the_trace_with_a_new_span() -> None:
    child = sample_envelope().caused("t", "/s")
    trace, span, flags = _parts(child.traceparent)
    assert trace == PARENT_TRACE
    assert span != PARENT_SPAN
    assert flags == "01"


def test_caused_keeps_the_trace_flags() -> None:
    child = sample_envelope(traceparent=f"00-{PARENT_TRACE}-{PARENT_SPAN}-00").caused("t", "/s")
    assert _parts(child.traceparent)[::2] == (PARENT_TRACE, "00")


def test_caused_uses_a_given_id() -> None:
    child = sample_envelope().caused("t", "/s", id="fixed-id")
    assert child.id == "fixed-id"
    assert child.causationid == sample_envelope().id


def test_two_children_of_one_parent_are_distinct() -> None:
    parent = sample_envelope()
    a = parent.caused("t", "/s")
    b = parent.caused("t", "/s")
    assert a.id != b.id
    assert _parts(a.traceparent)[1] != _parts(b.traceparent)[1]
    assert a.causationid == b.causationid == parent.id


def test_caused_does_not_touch_thesample_envelope() -> None:
    parent = sample_envelope()
    before = parent.headers()
    parent.caused("t", "/s")
    assert parent.headers() == before


def test_a_parent_with_no_trace_starts_a_fresh_one() -> None:
    child = sample_envelope(traceparent="").caused("t", "/s")
    _parts(child.traceparent)


def test_caused_headers_round_trip() -> None:
    child = sample_envelope().caused("t", "/s")
    assert Envelope.from_headers(child.headers()) == child
    assert dict(child.headers())["ce_causationid"] == sample_envelope().id.encode()


# ------------------------------------------------------------------- child_traceparent


def test_child_traceparent_of_a_validsample_envelope() -> None:
    trace, span, flags = _parts(child_traceparent(PARENT_TP))
    assert (trace, flags) == (PARENT_TRACE, "01")
    assert span != PARENT_SPAN


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "garbage",
        "00-xyz-abc-01",
        f"00-{'0' * 32}-{PARENT_SPAN}-01",  # all-zero trace id is invalid
        f"01-{PARENT_TRACE}-{PARENT_SPAN}-01",  # unknown version
        f"ff-{PARENT_TRACE}-{PARENT_SPAN}-01",  # forbidden version
        f"00-{PARENT_TRACE.upper()}-{PARENT_SPAN}-01",  # W3C demands lowercase hex
        f"00-{PARENT_TRACE[:-1]}-{PARENT_SPAN}-01",  # trace id too short
        f"00-{PARENT_TRACE}-{PARENT_SPAN}0-01",  # span id too long
        f" {PARENT_TP}",
        f"{PARENT_TP}-extra",
    ],
)
def test_child_traceparent_of_invalid_input_is_a_fresh_trace(bad: str) -> None:
    trace, span, flags = _parts(child_traceparent(bad))
    assert trace != "0" * 32
    assert trace != PARENT_TRACE
    assert span != "0" * 16
    assert flags == "01"


def test_fresh_traces_differ() -> None:
    traces = {_parts(child_traceparent("garbage"))[0] for _ in range(20)}
    assert len(traces) == 20


# ------------------------------------------------------------------- property


@given(
    n=st.integers(min_value=1, max_value=40),
    hops=st.integers(min_value=-5, max_value=DEFAULT_HOPS * 4),
)
def test_a_causation_chain_spends_one_hop_per_link_and_keeps_the_trace(n: int, hops: int) -> None:
    root = sample_envelope(hops=hops)
    env = root
    ids = [root.id]
    for i in range(n):
        child = env.caused(f"type-{i}", "/s")
        assert child.causationid == env.id
        assert child.correlationid == root.correlationid
        ids.append(child.id)
        env = child
    assert env.hops == hops - n
    assert _parts(env.traceparent)[0] == PARENT_TRACE
    assert len(set(ids)) == n + 1
