"""The audit checks each record's producer signature as the fleet's consumers do and seals the
verdict with the entry; only verified records may move an incident, and times are Kafka's,
never the unsigned ``ce_time`` (security review 3, M1 and L2)."""

from __future__ import annotations

from datetime import UTC, datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flotilla.authority import Signer
from flotilla.envelope import Envelope
from flotilla.fleet import DIAGNOSTIC, HEALTH
from flotilla.keys import Keyring
from flotilla.provenance import Provenance, sign_fact
from flotilla.records import DiagnosisConcluded, RecoveryCompleted
from flotilla.serde import AvroSerde
from services.audit.chain import Signer as ChainSigner
from services.audit.recorder import Recorder
from services.audit.timeline import NOT_CHECKED, TimelineRow, folds, timeline
from tests.support.messages import FakeMessage
from tests.unit.test_serde import FakeRegistry

DIAGNOSTIC_KEY = Signer(Ed25519PrivateKey.generate())
HEALTH_KEY = Signer(Ed25519PrivateKey.generate())
T0 = datetime(2026, 1, 1, 10, tzinfo=UTC)
PAYLOAD = b"\x00\x00\x00\x00\x07a diagnosis"


def _recorder() -> Recorder:
    trust = Provenance(
        {DIAGNOSTIC.name: Keyring([DIAGNOSTIC_KEY.public_key]), HEALTH.name: Keyring([HEALTH_KEY.public_key])}
    )
    return Recorder(AvroSerde(FakeRegistry()), ChainSigner(Ed25519PrivateKey.generate()), trust)


def _diagnosis(source: str = f"/flotilla/{DIAGNOSTIC.name}") -> Envelope:
    return Envelope(type=DiagnosisConcluded.TYPE, source=source, correlationid="incident-9")


def _signed(envelope: Envelope, signer: Signer = DIAGNOSTIC_KEY, payload: bytes = PAYLOAD) -> list[tuple[str, bytes]]:
    return [*envelope.headers(), ("ce_signature", sign_fact(signer, envelope, payload).encode())]


def test_a_record_its_producer_signed_is_verified_as_that_producer() -> None:
    assert _recorder().verdict(_signed(_diagnosis()), PAYLOAD) == (DIAGNOSTIC.name, None)


def test_forgeries_are_unverified_and_say_why() -> None:
    recorder = _recorder()
    fact = _diagnosis()
    cases = {
        "unsigned": (fact.headers(), PAYLOAD),
        "unknown-key": (_signed(fact, Signer(Ed25519PrivateKey.generate())), PAYLOAD),  # another key
        "wrong-producer": (_signed(_diagnosis("/flotilla/health-agent"), HEALTH_KEY), PAYLOAD),  # not its type
        "no envelope": ([("ce_correlationid", b"incident-other"), *_signed(fact)], PAYLOAD),  # repeated attribute
    }
    for why, (headers, payload) in cases.items():
        producer, reason = recorder.verdict(headers, payload)
        assert producer is None and reason is not None, why
        assert reason.startswith(why), (why, reason)
    # the signature covers the exact payload: an edited value is not the signed record
    producer, reason = recorder.verdict(_signed(fact), PAYLOAD + b"!")
    assert producer is None and reason is not None and reason.startswith("bad-signature"), reason


def test_the_entry_carries_the_verdict_and_a_repeated_correlation_files_it_under_no_incident() -> None:
    recorder = _recorder()
    signed = FakeMessage(value=PAYLOAD, headers=_signed(_diagnosis()))
    entry = recorder.entry(signed, 1, T0)
    assert (entry.verified_by, entry.unverified, entry.ce_correlationid) == (DIAGNOSTIC.name, None, "incident-9")
    # a genuine signed record with a forger's ce_correlationid put in front of its own
    doubled = FakeMessage(value=PAYLOAD, headers=[("ce_correlationid", b"incident-forged"), *_signed(_diagnosis())])
    entry = recorder.entry(doubled, 2, T0)
    assert entry.verified_by is None and entry.unverified is not None and "repeated" in entry.unverified
    assert entry.ce_correlationid is None and entry.ce_type == DiagnosisConcluded.TYPE


def test_only_decoded_verified_records_outside_the_dead_letter_topics_fold() -> None:
    fact = {"topic": "incidents", "record_type": RecoveryCompleted.TYPE, "decode_error": None}
    assert folds(**fact, verified_by=HEALTH.name)  # type: ignore[arg-type]
    assert not folds(**fact, verified_by=None)  # type: ignore[arg-type]
    assert not folds(**{**fact, "topic": "incidents.dlq"}, verified_by=HEALTH.name)  # type: ignore[arg-type]
    assert not folds(**{**fact, "decode_error": "x"}, verified_by=HEALTH.name)  # type: ignore[arg-type]
    assert not folds(**{**fact, "record_type": None}, verified_by=HEALTH.name)  # type: ignore[arg-type]


def _row(seq: int, **kw: object) -> TimelineRow:
    fields: dict[str, object] = {
        "seq": seq,
        "topic": "incidents",
        "partition": 0,
        "offset": seq,
        "ce_id": f"e{seq}",
        "ce_type": DiagnosisConcluded.TYPE,
        "ce_source": f"/flotilla/{DIAGNOSTIC.name}",
        "ce_causationid": None,
        "record_type": DiagnosisConcluded.TYPE,
        "at": T0,
        "value_json": "{}",
        "value": b"v",
        "decode_error": None,
        "headers": "[]",
        **kw,
    }
    return TimelineRow(**fields)  # type: ignore[arg-type]


def test_timeline_entries_say_whether_they_were_verified_and_show_the_claimed_time_apart() -> None:
    rows = [
        _row(1, verified_by=DIAGNOSTIC.name, ce_time="2099-01-01T00:00:00Z"),
        _row(2, unverified="unsigned: DiagnosisConcluded e2 from diagnostic-agent carries no ce_signature"),
        _row(3),  # recorded before the audit checked signatures
    ]
    first, forged, old = timeline(rows)
    assert first["verified"] is True and first["verifiedBy"] == DIAGNOSTIC.name and first["unverified"] is None
    assert first["claimedTime"] == "2099-01-01T00:00:00Z" and first["time"] == "2026-01-01T10:00:00.000Z"
    assert forged["verified"] is False and forged["verifiedBy"] is None and forged["unverified"].startswith("unsigned")
    assert old["verified"] is False and old["unverified"] == NOT_CHECKED
