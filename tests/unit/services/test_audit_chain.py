"""The audit chain without the stack: canonical entries, links, signatures, tampering,
the signing key file, and the incident views derived from the log."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flotilla.keys import Keyring
from flotilla.workflow import Status
from services.audit.chain import (
    GENESIS,
    Anchor,
    AnchorCheck,
    ChainVerifier,
    Entry,
    Sealed,
    Signer,
    anchor,
    canonical,
    check_anchors,
    headers_json,
    link,
    seal,
    verify,
)
from services.audit.timeline import TimelineRow, event_time, next_status, timeline

T0 = datetime(2025, 3, 1, 9, 30, 0, 123456, tzinfo=UTC)
FACT = "dev.flotilla.incidents."


def entry(seq: int, **overrides: object) -> Entry:
    base = Entry(
        seq=seq,
        topic="incidents",
        partition=2,
        offset=100 + seq,
        key=b"incident-7",
        kafka_timestamp_ms=1_740_821_400_000 + seq,
        headers=headers_json([("ce_id", f"id-{seq}".encode()), ("ce_type", b"T")]),
        ce_id=f"id-{seq}",
        ce_type=FACT + "ServiceLatencyIncreased",
        ce_source="/flotilla/health-agent",
        ce_time="2025-03-01T09:30:00.000Z",
        ce_correlationid="incident-7",
        ce_causationid=None,
        record_type=FACT + "ServiceLatencyIncreased",
        value=b"\x00\x00\x00\x00\x01payload",
        value_json='{"p95LatencyMs":1800.0}',
        decode_error=None,
        recorded_at=T0 + timedelta(seconds=seq),
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def signer() -> Signer:
    return Signer(Ed25519PrivateKey.generate())


def chain(signer: Signer, n: int) -> list[Sealed]:
    sealed, previous = [], GENESIS
    for seq in range(1, n + 1):
        item = seal(previous, entry(seq), signer)
        sealed.append(item)
        previous = item.entry_hash
    return sealed


def check(signer: Signer, sealed: list[Sealed], head: Sealed | None = None) -> tuple[bool, int | None, str]:
    last = head or (sealed[-1] if sealed else None)
    result = verify(
        sealed, Keyring([signer.public_key]), last.entry.seq if last else 0, last.entry_hash if last else GENESIS
    )
    broken = result.broken
    return result.ok, None if broken is None else broken.seq, "" if broken is None else broken.problem


# ----------------------------------------------------------------- hashing


def test_canonical_form_is_sorted_compact_ascii_json() -> None:
    text = canonical(entry(1)).decode("ascii")
    doc = json.loads(text)
    assert list(doc) == sorted(doc)
    assert ", " not in text and ": " not in text
    assert doc["key"] == "aW5jaWRlbnQtNw=="  # bytes as base64
    assert doc["recorded_at"] == "2025-03-01T09:30:01.123456+00:00"


def test_canonical_form_does_not_depend_on_the_time_zone_a_client_reads_in() -> None:
    utc = entry(1)
    elsewhere = replace(utc, recorded_at=utc.recorded_at.astimezone(timezone(timedelta(hours=-5))))
    assert canonical(utc) == canonical(elsewhere)


def test_canonical_form_refuses_naive_times() -> None:
    with pytest.raises(ValueError):
        canonical(entry(1, recorded_at=datetime(2025, 1, 1)))


def test_link_is_sha256_of_previous_hash_and_canonical_entry() -> None:
    e = entry(1)
    assert link(GENESIS, e) == hashlib.sha256(GENESIS + canonical(e)).digest()


def test_every_field_is_covered_by_the_hash() -> None:
    base = entry(3)
    changes: dict[str, object] = {
        "topic": "commands",
        "partition": 0,
        "offset": 1,
        "key": b"other",
        "kafka_timestamp_ms": 1,
        "headers": "[]",
        "ce_id": "x",
        "ce_type": "x",
        "ce_source": "x",
        "ce_time": "x",
        "ce_correlationid": "incident-8",
        "ce_causationid": "x",
        "record_type": "x",
        "value": b"other",
        "value_json": '{"p95LatencyMs":180.0}',
        "decode_error": "x",
        "recorded_at": T0,
        "verified_by": "health-agent",
        "unverified": "unsigned: x",
    }
    assert set(changes) | {"seq"} == set(base.__dataclass_fields__)
    for name, value in changes.items():
        assert link(GENESIS, replace(base, **{name: value})) != link(GENESIS, base), name  # type: ignore[arg-type]


def test_the_signature_verdict_is_sealed_and_entries_sealed_before_it_keep_their_hashes() -> None:
    before = entry(3)  # recorded before the audit checked producer signatures: no verdict
    assert "verified_by" not in json.loads(canonical(before)) and "unverified" not in json.loads(canonical(before))
    verified = replace(before, verified_by="health-agent")
    assert json.loads(canonical(verified))["verified_by"] == "health-agent"
    # whoever edits the database cannot flip a verdict, nor erase it, without breaking the link
    for edited in (replace(verified, verified_by="executor"), replace(verified, verified_by=None)):
        assert link(GENESIS, edited) != link(GENESIS, verified)
    refused = replace(before, unverified="unsigned: no ce_signature")
    assert link(GENESIS, replace(refused, unverified=None, verified_by="health-agent")) != link(GENESIS, refused)


def test_headers_json_keeps_order_and_bytes_that_are_not_text() -> None:
    rendered = json.loads(headers_json([("b", b"2"), ("a", b"\xff\x00"), ("c", None), ("b", b"nul\x00")]))
    assert rendered == [
        {"name": "b", "value": "2"},
        {"name": "a", "base64": "/wA="},
        {"name": "c", "value": None},
        {"name": "b", "base64": "bnVsAA=="},
    ]


# ----------------------------------------------------------- verification


def test_an_intact_chain_verifies(signer: Signer) -> None:
    sealed = chain(signer, 5)
    assert check(signer, sealed) == (True, None, "")


def test_an_empty_chain_verifies(signer: Signer) -> None:
    assert check(signer, []) == (True, None, "")


def test_signatures_are_ed25519_over_the_entry_hash(signer: Signer) -> None:
    item = chain(signer, 1)[0]
    signer.public_key.verify(item.signature, item.entry_hash)  # raises if not
    assert item.key_id == signer.key_id and len(item.key_id) == 16


def test_a_changed_entry_is_detected_at_that_entry(signer: Signer) -> None:
    sealed = chain(signer, 5)
    tampered = replace(sealed[2], entry=replace(sealed[2].entry, value_json='{"p95LatencyMs":180.0}'))
    ok, seq, problem = check(signer, [*sealed[:2], tampered, *sealed[3:]])
    assert (ok, seq) == (False, 3)
    assert "content does not match its hash" in problem


def test_a_recomputed_hash_without_the_key_is_detected_by_the_signature(signer: Signer) -> None:
    sealed = chain(signer, 5)
    changed = replace(sealed[2].entry, ce_correlationid="incident-other")
    forged = replace(sealed[2], entry=changed, entry_hash=link(sealed[1].entry_hash, changed))
    ok, seq, problem = check(signer, [*sealed[:2], forged, *sealed[3:]])
    assert (ok, seq) == (False, 3)
    assert "signature" in problem


def test_a_whole_chain_rebuilt_with_another_key_is_detected(signer: Signer) -> None:
    forger = Signer(Ed25519PrivateKey.generate())
    forged = chain(forger, 3)
    ok, seq, problem = check(signer, forged)
    assert (ok, seq) == (False, 1)
    assert "signed with key" in problem and "not trusted" in problem


def test_a_deleted_entry_is_detected(signer: Signer) -> None:
    sealed = chain(signer, 5)
    ok, seq, problem = check(signer, [*sealed[:2], *sealed[3:]])
    assert (ok, seq) == (False, 3)
    assert "missing" in problem


def test_reordered_entries_are_detected(signer: Signer) -> None:
    sealed = chain(signer, 4)
    ok, seq, _ = check(signer, [sealed[0], sealed[2], sealed[1], sealed[3]])
    assert (ok, seq) == (False, 2)


def test_a_relinked_entry_is_detected(signer: Signer) -> None:
    sealed = chain(signer, 3)
    relinked = replace(sealed[1], prev_hash=GENESIS)
    ok, seq, problem = check(signer, [sealed[0], relinked, sealed[2]])
    assert (ok, seq) == (False, 2)
    assert "previous-hash" in problem


def test_entries_cut_off_the_end_are_detected_against_the_chain_head(signer: Signer) -> None:
    sealed = chain(signer, 5)
    ok, seq, problem = check(signer, sealed[:3], head=sealed[4])
    assert (ok, seq) == (False, 4)
    assert "chain head" in problem


def test_the_verifier_takes_entries_in_batches_and_stops_at_the_first_break(signer: Signer) -> None:
    sealed = chain(signer, 6)
    tampered = replace(sealed[1], entry=replace(sealed[1].entry, offset=999))
    verifier = ChainVerifier(Keyring([signer.public_key]))
    assert verifier.feed(sealed[:1]) is True
    assert verifier.feed([tampered, *sealed[2:4]]) is False
    result = verifier.finish(6, sealed[-1].entry_hash)
    assert (result.ok, result.checked, result.broken) == (False, 1, result.broken)
    assert result.broken is not None and result.broken.seq == 2
    assert result.as_json()["firstBroken"] == {"seq": 2, "problem": result.broken.problem}


# -------------------------------------------------------------- anchors


def _anchored(signer: Signer, sealed: list[Sealed], *seqs: int, at: datetime = T0) -> list[Anchor]:
    return [anchor(q, sealed[q - 1].entry_hash, signer, at + timedelta(seconds=q)) for q in seqs]


def _against(
    signer: Signer, anchors: list[Anchor], sealed: list[Sealed], trusted: Keyring | None = None
) -> AnchorCheck:
    hashes = {s.entry.seq: s.entry_hash for s in sealed}
    last = sealed[-1].entry.seq if sealed else 0
    return check_anchors(anchors, trusted or Keyring([signer.public_key]), last, hashes)


def test_an_honest_log_holds_against_its_anchors(signer: Signer) -> None:
    sealed = chain(signer, 6)
    result = _against(signer, _anchored(signer, sealed, 2, 4, 6), sealed)
    assert result.broken is None and (result.checked, result.newest_seq) == (3, 6)


def test_a_cut_tail_with_a_rewritten_head_is_caught_by_an_anchor(signer: Signer) -> None:
    """The chain alone cannot tell: the owner deleted 5-6 and rewrote the head row to 4."""
    sealed = chain(signer, 6)
    anchors = _anchored(signer, sealed, 3, 6)
    assert check(signer, sealed[:4])[0] is True  # consistent with itself
    broken = _against(signer, anchors, sealed[:4]).broken
    assert broken is not None and broken.seq == 5 and "tail was cut" in broken.problem


def test_a_log_rebuilt_with_the_same_key_is_caught_by_the_anchors_published_before(signer: Signer) -> None:
    sealed = chain(signer, 5)
    anchors = _anchored(signer, sealed, 5)
    rebuilt, previous = [], GENESIS
    for seq in range(1, 6):  # entry 3 changed, every later hash and signature recomputed
        item = seal(previous, entry(seq, ce_correlationid="incident-x") if seq == 3 else entry(seq), signer)
        rebuilt.append(item)
        previous = item.entry_hash
    assert check(signer, rebuilt)[0] is True  # signed by the right key, linked, consistent
    broken = _against(signer, anchors, rebuilt).broken
    assert broken is not None and broken.seq == 5 and "rewritten" in broken.problem


def test_forged_anchors_are_untrusted_and_conflicting_ones_reported(signer: Signer) -> None:
    """A forged anchor is listed, never a verdict (N2: whoever writes the topic can make
    one); two genuine anchors that disagree are. More in test_audit_anchor_trust.py."""
    sealed = chain(signer, 4)
    rogue = Signer(Ed25519PrivateKey.generate())
    foreign = _against(signer, _anchored(rogue, sealed, 2), sealed)
    assert foreign.broken is None and foreign.checked == 0
    assert [(u.reason, u.seq) for u in foreign.untrusted] == [("untrusted-key", 2)]
    genuine = _anchored(signer, sealed, 2)[0]
    tampered = _against(signer, [replace(genuine, seq=3), genuine], sealed)
    assert tampered.broken is None and tampered.checked == 1
    assert [(u.reason, u.seq) for u in tampered.untrusted] == [("bad-signature", 3)]
    assert "forged" in tampered.untrusted[0].problem
    other = anchor(2, b"\x01" * 32, signer, T0)
    assert "disagree" in str(_against(signer, [genuine, other], sealed).broken)


def test_an_anchor_signature_survives_its_avro_round_trip(signer: Signer) -> None:
    import io

    from fastavro import parse_schema, schemaless_reader, schemaless_writer

    from flotilla.contracts import load_contracts

    made = anchor(7, b"\x02" * 32, signer, T0)
    schema = parse_schema(next(c.schema for c in load_contracts() if c.full_name.endswith("ChainAnchored")))
    buf = io.BytesIO()
    value = {"eventId": "6f1c1b52-8a55-4d55-9c69-5e0f4b1e2a10", "seq": 7, "entryHash": made.entry_hash}
    value.update(keyId=made.key_id, anchoredAt=made.anchored_at, signature=made.signature)
    schemaless_writer(buf, schema, value)
    back = schemaless_reader(io.BytesIO(buf.getvalue()), schema, None)
    assert isinstance(back, dict)
    decoded = Anchor(back["seq"], back["entryHash"], back["keyId"], back["anchoredAt"], back["signature"])
    signer.public_key.verify(decoded.signature, decoded.message())


# ------------------------------------------------------------ signing key


def test_the_audit_never_makes_its_own_key_and_trusts_only_configured_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flotilla.keys import load_or_create, public_key_text
    from services.audit.settings import AuditSettings

    missing = AuditSettings(audit_signing_key_file=tmp_path / "gone.pem")
    with pytest.raises(ValueError, match="never makes one itself"):
        missing.signer()
    assert not (tmp_path / "gone.pem").exists()
    key, _ = load_or_create(tmp_path / "audit.pem")
    other, _ = load_or_create(tmp_path / "other.pem")
    settings = AuditSettings(audit_signing_key_file=tmp_path / "audit.pem")
    signer = settings.signer()
    with pytest.raises(ValueError, match="FLOTILLA_AUDIT_PUBLIC_KEYS is empty"):
        settings.trusted_keys(signer)
    wrong = settings.model_copy(update={"audit_public_keys": [public_key_text(other.public_key())]})
    with pytest.raises(ValueError, match="not among"):
        wrong.trusted_keys(signer)
    both = settings.model_copy(
        update={"audit_public_keys": [public_key_text(key.public_key()), public_key_text(other.public_key())]}
    )
    assert set(both.trusted_keys(signer)) == {signer.key_id, Signer(other).key_id}  # rotation: both trusted


# --------------------------------------------------------------- timelines


def test_status_follows_the_incident_workflow_and_ignores_dead_letters_and_repeats() -> None:
    status = Status.NEW
    for record_type, topic in [
        (FACT + "ServiceLatencyIncreased", "incidents"),
        (FACT + "ServiceLatencyIncreased", "incidents"),  # a duplicate: no second transition
        (FACT + "DiagnosisRequested", "incidents"),
        ("dev.flotilla.decisions.DependencyFailureSuspected", "incidents.dlq"),  # dead: not applied
        ("dev.flotilla.commands.ScaleService", "commands"),  # not a workflow record
        (None, "incidents"),  # undecodable
    ]:
        status = next_status(status, record_type, topic)
    assert status is Status.DIAGNOSING


def test_event_time_is_the_kafka_time_never_later_than_the_recording_time() -> None:
    # ce_time is outside the producer's signature: never a record's time
    assert event_time(1_740_821_400_000, T0) == datetime.fromtimestamp(1_740_821_400, tz=UTC)
    assert event_time(4_070_908_800_000, T0) == T0  # dated into 2099: cut to when it was recorded
    assert event_time(None, T0) == T0 and event_time(0, T0) == T0


def _row(seq: int, at_ms: int, **kw: object) -> TimelineRow:
    base = TimelineRow(
        seq=seq,
        topic="incidents",
        partition=0,
        offset=seq,
        ce_id=f"e{seq}",
        ce_type=FACT + "X",
        ce_source="/flotilla/x",
        ce_causationid=None,
        record_type=FACT + "X",
        at=T0 + timedelta(milliseconds=at_ms),
        value_json='{"a":1}',
        value=b"raw",
        decode_error=None,
        headers="[]",
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_timeline_is_in_event_order_with_elapsed_time_and_causes() -> None:
    rows = [
        _row(1, 0, record_type=FACT + "ServiceLatencyIncreased"),
        _row(3, 900, ce_causationid="e2", topic="commands", record_type="dev.flotilla.commands.ScaleService"),
        _row(2, 40, ce_causationid="e1", record_type=FACT + "DiagnosisRequested"),
    ]
    entries = timeline(rows)
    assert [e["seq"] for e in entries] == [1, 2, 3]
    assert [e["elapsedMs"] for e in entries] == [0, 40, 900]
    assert entries[0]["causedBy"] is None
    assert entries[1]["causedBy"] == {"seq": 1, "type": FACT + "ServiceLatencyIncreased", "eventId": "e1"}
    assert entries[2]["causedBy"]["seq"] == 2
    assert entries[0]["value"] == {"a": 1}


def test_timeline_shows_dead_letters_with_their_context_and_raw_bytes() -> None:
    context = json.dumps([{"name": "ce_id", "value": "e1"}, {"name": "dlq_reason", "value": "undecodable"}])
    rows = [
        _row(1, 0),
        _row(2, 10, topic="incidents.dlq", ce_id="e1", value_json=None, record_type=None, headers=context),
        _row(3, 20, ce_causationid="e1"),
    ]
    entries = timeline(rows)
    dead = entries[1]
    assert dead["deadLetter"] == {"reason": "undecodable"}
    assert dead["valueBase64"] == "cmF3" and dead["value"] is None
    assert dead["type"] == FACT + "X"  # what ce_type claimed
    assert entries[2]["causedBy"]["seq"] == 1  # causes point at the original, not its dead letter


def test_a_timeline_page_counts_from_the_incidents_first_record_and_links_causes_on_other_pages() -> None:
    # the second page of an incident: its first record (seq 1, at T0) and a cause (seq 2) are elsewhere
    page = [
        _row(5, 900, ce_id="e5", ce_causationid="e2"),
        _row(6, 950, ce_id="e6", ce_causationid="e5"),
        _row(7, 990, ce_id="e7", ce_causationid="e-unknown"),
    ]
    elsewhere = [_row(2, 40, ce_id="e2", record_type=FACT + "DiagnosisRequested")]
    entries = timeline(page, start=T0, causes=elsewhere)
    assert [e["seq"] for e in entries] == [5, 6, 7]  # only the page's own records are shown
    assert [e["elapsedMs"] for e in entries] == [900, 950, 990]  # as on one page of everything
    assert entries[0]["causedBy"] == {"seq": 2, "type": FACT + "DiagnosisRequested", "eventId": "e2"}
    assert entries[1]["causedBy"]["seq"] == 5
    assert entries[2]["causedBy"] is None and entries[2]["causationId"] == "e-unknown"
    assert [e["elapsedMs"] for e in timeline(page)] == [0, 50, 90]  # without a start: the page's first


def test_audit_settings_default_to_every_topic_and_a_key_beside_the_stack_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from services.audit.settings import AuditSettings

    for name in [n for n in os.environ if n.startswith("FLOTILLA_")]:  # nothing of the shell leaks in
        monkeypatch.delenv(name)

    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(tmp_path / ".stack" / "stack.env"))
    settings = AuditSettings.load()
    assert settings.audit_topics == ("incidents", "commands", "incidents.dlq", "commands.dlq")
    assert settings.signing_key_path == tmp_path / ".stack" / "audit" / "signing-key.pem"
    monkeypatch.setenv("FLOTILLA_AUDIT_SIGNING_KEY_FILE", str(tmp_path / "k.pem"))
    assert AuditSettings.load().signing_key_path == tmp_path / "k.pem"
