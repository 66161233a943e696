"""The CloudEvents envelope as Kafka headers (binary mode), and back."""

from __future__ import annotations

import re
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flotilla.envelope import (
    CONTENT_TYPE,
    DEFAULT_HOPS,
    SPEC_VERSION,
    Envelope,
    RawHeaders,
    header_pairs,
    new_traceparent,
)
from tests.support.messages import sample_envelope

TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01")
REQUIRED = ("ce_id", "ce_type", "ce_source", "ce_correlationid", "ce_hops")


def _without(headers: list[tuple[str, bytes]], *names: str) -> list[tuple[str, bytes]]:
    return [(k, v) for k, v in headers if k not in names]


# ----------------------------------------------------------------------- headers()


def test_headers_carry_every_attribute_as_bytes() -> None:
    env = sample_envelope(causationid="cause-1")
    headers = env.headers()
    assert all(isinstance(v, bytes) for _, v in headers)
    as_dict = dict(headers)
    assert len(as_dict) == len(headers), "a header name appears twice"
    assert as_dict == {
        "ce_specversion": SPEC_VERSION.encode(),
        "ce_id": b"6f1c1b52-8a55-4d55-9c69-5e0f4b1e2a10",
        "ce_type": b"dev.flotilla.incidents.ServiceLatencyIncreased",
        "ce_source": b"/agents/health",
        "ce_time": b"2024-05-01T12:00:00.123Z",
        "ce_correlationid": b"incident-204",
        "ce_causationid": b"cause-1",
        "ce_hops": b"7",
        "ce_traceparent": b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "content-type": CONTENT_TYPE.encode(),
    }
    assert as_dict["content-type"] == b"application/avro"
    assert as_dict["ce_specversion"] == b"1.0"


def test_headers_omit_causationid_when_none() -> None:
    names = [k for k, _ in sample_envelope(causationid=None).headers()]
    assert "ce_causationid" not in names
    assert set(names) == {
        "ce_specversion",
        "ce_id",
        "ce_type",
        "ce_source",
        "ce_time",
        "ce_correlationid",
        "ce_hops",
        "ce_traceparent",
        "content-type",
    }


def test_defaults_fill_id_time_hops_and_traceparent() -> None:
    env = Envelope(type="t", source="s", correlationid="c")
    assert str(uuid.UUID(env.id)) == env.id
    assert env.hops == DEFAULT_HOPS
    assert env.causationid is None
    assert env.specversion == SPEC_VERSION
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", env.time), env.time
    assert TRACEPARENT.fullmatch(env.traceparent)
    other = Envelope(type="t", source="s", correlationid="c")
    assert other.id != env.id
    assert other.traceparent != env.traceparent


# ------------------------------------------------------------------ from_headers()


def test_round_trip_through_header_pairs() -> None:
    for env in (sample_envelope(), sample_envelope(causationid="cause-9", hops=0, specversion="1.0")):
        assert Envelope.from_headers(env.headers()) == env


def test_round_trip_from_a_dict_of_str_values() -> None:
    env = sample_envelope(causationid="cause-2")
    as_str = {k: v.decode() for k, v in env.headers()}
    assert Envelope.from_headers(as_str) == env


def test_round_trip_from_a_dict_of_bytes_values() -> None:
    env = sample_envelope()
    assert Envelope.from_headers(dict(env.headers())) == env


def test_from_headers_ignores_foreign_and_none_headers() -> None:
    env = sample_envelope()
    headers: list[tuple[str, str | bytes | None]] = [
        ("traceparent", b"ignored"),
        ("x-other", "value"),
        ("ce_causationid", None),
        *env.headers(),
    ]
    back = Envelope.from_headers(headers)
    assert back == env
    assert back.causationid is None


def test_from_headers_fills_optional_attributes_when_absent() -> None:
    headers = _without(sample_envelope().headers(), "ce_time", "ce_traceparent", "ce_specversion", "ce_causationid")
    back = Envelope.from_headers(headers)
    assert back.time == ""
    assert back.traceparent == ""
    assert back.specversion == SPEC_VERSION
    assert back.causationid is None
    assert back.hops == 7


def test_header_pairs_normalises_every_shape() -> None:
    assert list(header_pairs(None)) == []
    assert list(header_pairs([])) == []
    assert list(header_pairs({"a": "x", "b": b"y", "c": None})) == [("a", b"x"), ("b", b"y"), ("c", None)]
    assert list(header_pairs([("a", "é"), ("a", b"z")])) == [("a", "é".encode()), ("a", b"z")]


@pytest.mark.parametrize("absent", [(name,) for name in REQUIRED] + [("ce_id", "ce_hops"), REQUIRED])
def test_missing_required_headers_are_named(absent: tuple[str, ...]) -> None:
    headers = _without(sample_envelope().headers(), *absent)
    with pytest.raises(ValueError, match="missing CloudEvents header") as info:
        Envelope.from_headers(headers)
    message = str(info.value)
    for name in REQUIRED:
        if name in absent:
            assert name in message
        else:
            assert name not in message


def test_no_headers_at_all_names_every_required_one() -> None:
    empties: list[RawHeaders] = [None, [], {}]
    for empty in empties:
        with pytest.raises(ValueError) as info:
            Envelope.from_headers(empty)
        assert all(name in str(info.value) for name in REQUIRED)


def test_a_none_required_header_counts_as_missing() -> None:
    headers: list[tuple[str, bytes | None]] = [*_without(sample_envelope().headers(), "ce_type"), ("ce_type", None)]
    with pytest.raises(ValueError, match="ce_type"):
        Envelope.from_headers(headers)


@pytest.mark.parametrize("hops", [b"many", b"", b"1.5", b"0x10"])
def test_non_integer_hops_is_refused(hops: bytes) -> None:
    headers = [*_without(sample_envelope().headers(), "ce_hops"), ("ce_hops", hops)]
    with pytest.raises(ValueError, match="ce_hops is not an integer") as info:
        Envelope.from_headers(headers)
    assert repr(hops.decode()) in str(info.value)


# ------------------------------------------------------------------- traceparent


def test_new_traceparent_is_w3c_shaped_and_fresh() -> None:
    seen = {new_traceparent() for _ in range(50)}
    assert len(seen) == 50
    for tp in seen:
        assert TRACEPARENT.fullmatch(tp), tp
    trace_ids = {tp.split("-")[1] for tp in seen}
    span_ids = {tp.split("-")[2] for tp in seen}
    assert len(trace_ids) == 50
    assert len(span_ids) == 50


# ---------------------------------------------------------------------- property

_text = st.text(st.characters(codec="utf-8"), max_size=40)


@given(
    type_=_text,
    source=_text,
    correlationid=_text,
    id_=_text,
    time=_text,
    causationid=st.none() | _text,
    hops=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    traceparent=_text,
    specversion=_text,
)
def test_any_envelope_round_trips(
    type_: str,
    source: str,
    correlationid: str,
    id_: str,
    time: str,
    causationid: str | None,
    hops: int,
    traceparent: str,
    specversion: str,
) -> None:
    env = Envelope(
        type=type_,
        source=source,
        correlationid=correlationid,
        id=id_,
        time=time,
        causationid=causationid,
        hops=hops,
        traceparent=traceparent,
        specversion=specversion,
    )
    headers = env.headers()
    assert Envelope.from_headers(headers) == env
    assert Envelope.from_headers({k: v.decode() for k, v in headers}) == env
