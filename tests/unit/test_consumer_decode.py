"""Decoding in the consumer loop: whatever a record holds, it becomes an item to handle or a
dead letter — never an exception that would crash the loop and block its partition. The
one exception is a registry that cannot answer: then the loop waits, dead-letters nothing
and commits nothing."""

from __future__ import annotations

import threading
from typing import Any

from confluent_kafka.schema_registry.error import SchemaRegistryError
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from flotilla.authority import Signer
from flotilla.consumer import ConsumerLoop, LoopConfig
from flotilla.deadletter import Reason
from flotilla.envelope import Envelope
from flotilla.fleet import POLICY
from flotilla.keys import Keyring
from flotilla.provenance import Provenance, sign_fact
from flotilla.records import RecoveryApproved
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from tests.support.messages import FakeMessage
from tests.unit.test_serde import _NOT_RECORDS, RECORD, SCHEMA_ID, SCHEMA_STR, SUBJECT, TOPIC, FakeRegistry, _value

ROGUE_ID = 4242  # the same record schema, registered under a subject of its own


def _registry() -> FakeRegistry:
    registry = FakeRegistry()
    registry.add(SUBJECT, SCHEMA_ID, SCHEMA_STR)
    registry.add(f"rogue-{RECORD}", ROGUE_ID, SCHEMA_STR)
    for schema_id, (text, kind) in _NOT_RECORDS.items():
        registry.add(f"elsewhere-{schema_id}", schema_id, text, kind)
    return registry


def _loop(registry: FakeRegistry) -> ConsumerLoop:
    # Nothing connects: Consumer/Producer construction is lazy, and no pool is used here.
    return ConsumerLoop(
        LoopConfig(name="decode-t", topics=(TOPIC,), source="/t", backoff_initial=0.001, backoff_max=0.002),
        StackSettings(),
        serde=AvroSerde(registry),
        pool=None,  # type: ignore[arg-type]
        handlers={},
    )


_REGISTRY = _registry()
_LOOP = _loop(_REGISTRY)
_GOOD = AvroSerde(_REGISTRY).serialize(TOPIC, RECORD, _value())

_ids = st.sampled_from([SCHEMA_ID, ROGUE_ID, *_NOT_RECORDS]) | st.integers(0, 2**32 - 1)
_frames = st.one_of(
    st.binary(max_size=64),
    st.builds(lambda i, body: b"\x00" + i.to_bytes(4, "big") + body, _ids, st.binary(max_size=64)),
    st.builds(lambda i, cut: b"\x00" + i.to_bytes(4, "big") + _GOOD[5:cut], _ids, st.integers(5, len(_GOOD))),
    st.builds(lambda flip: bytes(b ^ (0xFF if n == flip else 0) for n, b in enumerate(_GOOD)), st.integers(5, 80)),
)
_envelope = Envelope(type=RECORD, source="/fuzz", correlationid="incident-1").headers()
_headers = st.one_of(
    st.just(_envelope),
    st.lists(st.tuples(st.text(max_size=12), st.one_of(st.none(), st.binary(max_size=40))), max_size=8),
    st.builds(lambda extra: _envelope + extra, st.lists(st.tuples(st.just("ce_hops"), st.binary(max_size=4)))),
)


@settings(max_examples=600, deadline=None)
@given(value=_frames, headers=_headers, key=st.none() | st.binary(max_size=16))
def test_no_record_crashes_the_decoder(value: bytes, headers: Any, key: bytes | None) -> None:
    item = _LOOP._decode(FakeMessage(topic=TOPIC, key=key, value=value, headers=headers))
    assert (item.incoming is None) != (item.letter is None)
    if item.incoming is not None and not item.dropped:
        # only a record of our own subject decodes
        assert item.incoming.record_type == RECORD and value[1:5] == SCHEMA_ID.to_bytes(4, "big")


def test_each_kind_of_poison_is_a_dead_letter_with_its_reason() -> None:
    def letter(value: bytes) -> Reason:
        item = _LOOP._decode(FakeMessage(topic=TOPIC, value=value, headers=_envelope))
        assert item.letter is not None, item
        return item.letter.reason

    for schema_id in _NOT_RECORDS:
        assert letter(b"\x00" + schema_id.to_bytes(4, "big") + b"\x02x") is Reason.UNDECODABLE
    assert letter(b"\x00" + ROGUE_ID.to_bytes(4, "big") + _GOOD[5:]) is Reason.UNDECODABLE
    assert letter(b"\x00" + (999_999).to_bytes(4, "big")) is Reason.UNKNOWN_SCHEMA
    item = _LOOP._decode(FakeMessage(topic=TOPIC, value=_GOOD, headers=_envelope))
    assert item.incoming is not None and item.incoming.record_type == RECORD


def test_a_registry_outage_waits_instead_of_dead_lettering() -> None:
    registry = _registry()
    loop = _loop(registry)
    registry.fail_with = SchemaRegistryError(503, 50301, "unavailable")
    msg = FakeMessage(topic=TOPIC, value=_GOOD, headers=_envelope)
    back = threading.Timer(0.05, lambda: setattr(registry, "fail_with", None))
    back.start()
    items = loop._decode_batch([msg])
    back.join()
    assert items is not None and items[0].incoming is not None
    assert registry.calls["get_schema", SCHEMA_ID] > 1  # it was asked again until it answered


def test_stopping_during_a_registry_outage_processes_and_commits_nothing() -> None:
    registry = _registry()
    loop = _loop(registry)
    registry.fail_with = ConnectionError("refused")
    threading.Timer(0.05, loop.stop).start()
    assert loop._decode_batch([FakeMessage(topic=TOPIC, value=_GOOD, headers=_envelope)]) is None


# ------------------------------------------------------- records the loop only steps over


def _signed_loop(handled: tuple[str, ...], provenance: bool = True) -> tuple[ConsumerLoop, Signer]:
    signer = Signer(Ed25519PrivateKey.generate())
    trust = Provenance({POLICY.name: Keyring([signer.public_key])}) if provenance else None
    loop = ConsumerLoop(
        LoopConfig(name="steps-t", topics=(RecoveryApproved.TOPIC,), source="/t"),
        StackSettings(),
        serde=AvroSerde(_REGISTRY),  # knows none of the fleet's contracts: any decoding fails
        pool=None,  # type: ignore[arg-type]
        handlers=dict.fromkeys(handled, lambda ctx: None),
        provenance=trust,
    )
    return loop, signer


def _approval(signer: Signer, payload: bytes) -> FakeMessage:
    env = Envelope(type=RecoveryApproved.TYPE, source=f"/flotilla/{POLICY.name}", correlationid="incident-7")
    headers = [*env.headers(), ("ce_signature", sign_fact(signer, env, payload).encode())]
    return FakeMessage(topic=RecoveryApproved.TOPIC, value=payload, headers=headers)


def test_a_signed_record_no_handler_reads_steps_the_workflow_without_being_decoded() -> None:
    # a storm's agents spent a third of their loop decoding records they only step over
    loop, signer = _signed_loop(handled=())
    item = loop._decode(_approval(signer, b"\x00\x00\x00\x00\x07not avro at all"))
    assert item.letter is None and item.incoming is not None
    assert (item.incoming.record_type, item.incoming.value) == (RecoveryApproved.TYPE, {})


def test_its_signature_is_still_checked() -> None:
    loop, _ = _signed_loop(handled=())
    forged = _approval(Signer(Ed25519PrivateKey.generate()), b"\x00\x00\x00\x00\x07anything")
    item = loop._decode(forged)
    assert item.letter is not None and item.letter.reason is Reason.UNAUTHORIZED


def test_a_record_a_handler_reads_or_one_no_signature_vouches_for_is_decoded() -> None:
    for loop, signer in (_signed_loop(handled=(RecoveryApproved.TYPE,)), _signed_loop((), provenance=False)):
        item = loop._decode(_approval(signer, b"\x00\x00\x00\x00\x07not avro at all"))
        assert item.letter is not None and item.letter.reason in (Reason.UNKNOWN_SCHEMA, Reason.UNDECODABLE)
