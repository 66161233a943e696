"""command_digest: the canonical SHA-256 that binds an approval to an exact command."""

from __future__ import annotations

import copy
import random
import re
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flotilla.digest import canonical_json, command_digest

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
COMMAND_ID = uuid.UUID("3d0f4b8e-0a4e-4c1e-9a53-2f4f3b2b1e11")
PROPOSAL_ID = uuid.UUID("9b2d7c1a-5e6f-4a3b-8c9d-0e1f2a3b4c5d")
ISSUED = datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)


def _scale(**overrides: Any) -> dict[str, Any]:
    step: dict[str, Any] = {
        "commandId": COMMAND_ID,
        "idempotencyKey": "incident-204:scale:12",
        "incidentId": "incident-204",
        "proposalId": PROPOSAL_ID,
        "target": {"kind": "service", "environment": "production", "name": "checkout-api"},
        "replicas": 12,
        "issuedAt": ISSUED,
        "expiresAt": ISSUED + timedelta(minutes=15),
    }
    step.update(overrides)
    return step


def _reversed_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reversed_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_keys(v) for v in value]
    return value


def test_digest_shape() -> None:
    assert DIGEST.fullmatch(command_digest([_scale()]))
    assert DIGEST.fullmatch(command_digest([]))


def test_digest_is_deterministic() -> None:
    assert command_digest([_scale()]) == command_digest([_scale()])


def test_digest_is_stable_across_key_order() -> None:
    step = _scale()
    flipped = _reversed_keys(step)
    assert list(flipped) != list(step)
    assert list(flipped["target"]) != list(step["target"])
    assert command_digest([flipped]) == command_digest([step])


@pytest.mark.parametrize(
    "change",
    [
        {"replicas": 13},
        {"idempotencyKey": "incident-204:scale:13"},
        {"target": {"kind": "service", "environment": "production", "name": "payments-api"}},
        {"target": {"kind": "service", "environment": "staging", "name": "checkout-api"}},
        {"commandId": uuid.UUID("3d0f4b8e-0a4e-4c1e-9a53-2f4f3b2b1e12")},
        {"proposalId": uuid.uuid4()},
        {"incidentId": "incident-205"},
        {"issuedAt": ISSUED + timedelta(milliseconds=1)},
        {"expiresAt": ISSUED + timedelta(minutes=16)},
    ],
    ids=lambda c: next(iter(c)),
)
def test_any_parameter_change_changes_the_digest(change: dict[str, Any]) -> None:
    assert command_digest([_scale(**change)]) != command_digest([_scale()])


def test_replicas_12_and_13_differ() -> None:
    assert command_digest([_scale(replicas=12)]) != command_digest([_scale(replicas=13)])


def test_an_extra_or_missing_field_changes_the_digest() -> None:
    base = command_digest([_scale()])
    assert command_digest([_scale(note="x")]) != base
    trimmed = _scale()
    del trimmed["expiresAt"]
    assert command_digest([trimmed]) != base


def test_step_order_and_count_matter() -> None:
    a, b = _scale(replicas=12), _scale(replicas=20, idempotencyKey="incident-204:scale:20")
    assert command_digest([a, b]) != command_digest([b, a])
    assert command_digest([a]) != command_digest([a, a])


def test_tuple_and_list_of_steps_agree() -> None:
    assert command_digest((_scale(),)) == command_digest([_scale()])


def test_uuid_and_its_string_digest_the_same() -> None:
    as_text = _scale(commandId=str(COMMAND_ID), proposalId=str(PROPOSAL_ID))
    assert command_digest([as_text]) == command_digest([_scale()])


def test_aware_datetimes_are_epoch_millis() -> None:
    millis = 1714564800123  # 2024-05-01T12:00:00.123Z
    assert canonical_json({"t": ISSUED}) == f'{{"t":{millis}}}'.encode()
    as_int = _scale(issuedAt=millis, expiresAt=millis + 15 * 60 * 1000)
    assert command_digest([as_int]) == command_digest([_scale()])


def test_the_same_instant_in_two_timezones_digests_the_same() -> None:
    ist = timezone(timedelta(hours=5, minutes=30))
    pst = timezone(timedelta(hours=-8))
    in_ist = _scale(issuedAt=ISSUED.astimezone(ist), expiresAt=(ISSUED + timedelta(minutes=15)).astimezone(pst))
    assert in_ist["issuedAt"].hour != ISSUED.hour
    assert command_digest([in_ist]) == command_digest([_scale()])


def test_sub_millisecond_precision_is_dropped() -> None:
    finer = _scale(issuedAt=ISSUED + timedelta(microseconds=456))
    assert command_digest([finer]) == command_digest([_scale()])


@pytest.mark.parametrize("where", ["issuedAt", "nested", "list"])
def test_naive_datetimes_are_refused(where: str) -> None:
    naive = datetime(2024, 5, 1, 12, 0)
    step = _scale()
    if where == "issuedAt":
        step["issuedAt"] = naive
    elif where == "nested":
        step["target"] = {**step["target"], "since": naive}
    else:
        step["window"] = [ISSUED, naive]
    with pytest.raises(ValueError, match="naive datetime"):
        command_digest([step])


def test_canonical_json_is_compact_and_sorted() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": None, "c": True}]}) == b'{"a":[1,{"c":true,"d":null}],"b":1}'


def test_canonical_json_keeps_non_ascii_text() -> None:
    assert canonical_json({"name": "café"}) == '{"name":"café"}'.encode()


def test_digest_does_not_mutate_its_input() -> None:
    step = _scale()
    before = copy.deepcopy(step)
    command_digest([step])
    assert step == before


# ------------------------------------------------------------------- property

_keys = st.text(min_size=1, max_size=8)
_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.uuids()
    | st.datetimes(timezones=st.timezones()).filter(lambda d: d.utcoffset() is not None)
)
_values = st.recursive(
    _leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=5),
    max_leaves=25,
)
_nested_dicts = st.dictionaries(_keys, _values, min_size=1, max_size=6)


def _shuffled(value: Any, rnd: random.Random) -> Any:
    if isinstance(value, dict):
        keys = list(value)
        rnd.shuffle(keys)
        return {k: _shuffled(value[k], rnd) for k in keys}
    if isinstance(value, list):
        return [_shuffled(v, rnd) for v in value]
    return value


@given(_nested_dicts, st.randoms(use_true_random=False))
def test_digest_ignores_key_order_of_nested_dicts(value: dict[str, Any], rnd: random.Random) -> None:
    assert command_digest([_shuffled(value, rnd)]) == command_digest([value])


@given(_nested_dicts, st.text(min_size=1, max_size=8))
def test_adding_a_key_changes_the_digest(value: dict[str, Any], key: str) -> None:
    if key in value:
        return
    assert command_digest([{**value, key: "added"}]) != command_digest([value])
