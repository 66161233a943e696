"""A record whose CloudEvents attributes (``ce_*`` headers) repeat has no one envelope: Kafka
keeps every copy, and readers that took the first copy (the skip filter, the audit) and
readers that took the last (the envelope, the signature check) read two different records.
One helper decides for all of them (``flotilla.envelope.header_value``): such a record is
refused by the envelope, dead-lettered by the fleet's loop, and believed by nobody."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flotilla.authority import Signer
from flotilla.consumer import ConsumerLoop, LoopConfig
from flotilla.deadletter import Reason
from flotilla.envelope import Envelope, header_value, repeated_attributes
from flotilla.fleet import DIAGNOSTIC
from flotilla.keys import Keyring
from flotilla.provenance import Provenance, sign_fact, signature_header
from flotilla.rawrecords import first_header
from flotilla.records import DiagnosisConcluded, RecoveryCompleted
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from flotilla.tailing import header
from tests.support.messages import FakeMessage
from tests.unit.test_serde import FakeRegistry

GENUINE = Envelope(
    type=DiagnosisConcluded.TYPE, source=f"/flotilla/{DIAGNOSTIC.name}", correlationid="incident-genuine"
)
PAYLOAD = b"\x00\x00\x00\x00\x07signed payload"
SIGNER = Signer(Ed25519PrivateKey.generate())


def _signed() -> list[tuple[str, bytes]]:
    return [*GENUINE.headers(), ("ce_signature", sign_fact(SIGNER, GENUINE, PAYLOAD).encode())]


def test_a_repeated_attribute_has_no_value_for_any_reader() -> None:
    # a forger puts its own correlation id first, before the signed record's own
    headers = [("ce_correlationid", b"incident-forged"), *_signed(), ("content-type", b"b")]
    assert repeated_attributes(headers) == ["ce_correlationid"]
    for read in (header_value, header):
        assert read(headers, "ce_correlationid") is None
        assert read(headers, "ce_id") == GENUINE.id.encode()
        assert read(headers, "content-type") == b"application/avro"  # not an attribute: its first value
    assert first_header(headers, "ce_correlationid") is None  # the audit files it under no incident
    assert first_header(headers, "ce_type") == GENUINE.type
    with pytest.raises(ValueError, match=r"repeated CloudEvents header\(s\): ce_correlationid"):
        Envelope.from_headers(headers)


def test_a_repeated_signature_is_no_signature() -> None:
    other = Signer(Ed25519PrivateKey.generate())
    headers = [*_signed(), ("ce_signature", sign_fact(other, GENUINE, PAYLOAD).encode())]
    assert signature_header(headers) is None
    assert signature_header(_signed()) is not None
    assert repeated_attributes(_signed()) == [] and Envelope.from_headers(_signed()) == GENUINE


def test_the_same_attribute_repeated_with_the_same_value_is_still_refused() -> None:
    headers = [*_signed(), ("ce_hops", str(GENUINE.hops).encode())]
    with pytest.raises(ValueError, match="ce_hops"):
        Envelope.from_headers(headers)


def _loop() -> ConsumerLoop:
    # nothing connects, and no pool is used: only the loop's reading is under test
    return ConsumerLoop(
        LoopConfig(name="repeat-t", topics=("incidents",), source="/t", needs=frozenset({RecoveryCompleted.TYPE})),
        StackSettings(),
        serde=AvroSerde(FakeRegistry()),
        pool=None,  # type: ignore[arg-type]
        handlers={},
        provenance=Provenance({DIAGNOSTIC.name: Keyring([SIGNER.public_key])}),
    )


def test_the_fleet_reads_and_dead_letters_a_record_with_a_repeated_attribute() -> None:
    loop = _loop()
    genuine = FakeMessage(value=PAYLOAD, headers=_signed())
    assert loop._needed([genuine]) == []  # a type this loop does not need: skipped unread
    # the first ce_type names a type the loop needs, the last the signed one: no copy is believed
    doubled = FakeMessage(value=PAYLOAD, headers=[("ce_type", RecoveryCompleted.TYPE.encode()), *_signed()])
    also = FakeMessage(value=PAYLOAD, headers=[*_signed(), ("ce_type", b"dev.flotilla.incidents.AlertObserved")])
    assert loop._needed([doubled, also]) == [doubled, also]  # read, never skipped by one copy
    for msg in (doubled, also, FakeMessage(value=PAYLOAD, headers=[("ce_correlationid", b"x"), *_signed()])):
        item = loop._decode(msg)
        assert item.incoming is None and item.letter is not None
        assert item.letter.reason is Reason.UNDECODABLE and "repeated CloudEvents header" in str(item.letter.error)
