"""Security finding N2: what is on ``audit.anchors`` but not signed by a trusted key is
reported as untrusted and changes no verdict, and every trusted anchor is still checked.

The attacker can write the topic (or the audit database's outbox) but holds no trusted
key. Everything runs the real code: keys made and loaded by :mod:`flotilla.keys`, the
keyring as ``FLOTILLA_AUDIT_PUBLIC_KEYS`` configures it, and ``/verify``'s own
:func:`services.audit.api.verify_chain` over an in-memory stand-in for the database
snapshot (rows exactly as the audit stores them)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from flotilla.keys import Keyring, load_or_create, load_private_key, public_key_text
from services.audit.api import verify_chain
from services.audit.chain import (
    BAD_SIGNATURE,
    GENESIS,
    MALFORMED,
    UNTRUSTED_KEY,
    UNTRUSTED_LISTED,
    Anchor,
    Entry,
    Sealed,
    Signer,
    anchor,
    check_anchors,
    headers_json,
    seal,
    unreadable_anchor,
)

T0 = datetime(2025, 3, 1, 9, 30, 0, 123456, tzinfo=UTC)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Signer, Keyring, Signer]:
    """The audit's signer and the keyring ``FLOTILLA_AUDIT_PUBLIC_KEYS`` makes of its public
    key (one entry, as text); and a key of the attacker's own, which nobody trusts."""
    home: Path = tmp_path_factory.mktemp("keys")
    load_or_create(home / "audit.pem")
    rogue_key, _ = load_or_create(home / "rogue.pem")
    signer = Signer(load_private_key(home / "audit.pem"))
    trusted = Keyring.parse([public_key_text(signer.public_key)])
    assert list(trusted) == [signer.key_id]
    return signer, trusted, Signer(rogue_key)


def _entry(seq: int) -> Entry:
    return Entry(
        seq=seq,
        topic="commands",
        partition=0,
        offset=seq,
        key=b"incident-1",
        kafka_timestamp_ms=1_740_821_400_000 + seq,
        headers=headers_json([("ce_id", f"id-{seq}".encode())]),
        ce_id=f"id-{seq}",
        ce_type="dev.flotilla.commands.ScaleService",
        ce_source="/flotilla/policy",
        ce_time=None,
        ce_correlationid="incident-1",
        ce_causationid=None,
        record_type="dev.flotilla.commands.ScaleService",
        value=b"\x00\x00\x00\x00\x01v",
        value_json='{"replicas":3}',
        decode_error=None,
        recorded_at=T0 + timedelta(seconds=seq),
    )


def _chain(signer: Signer, n: int) -> list[Sealed]:
    sealed, previous = [], GENESIS
    for seq in range(1, n + 1):
        item = seal(previous, _entry(seq), signer)
        sealed.append(item)
        previous = item.entry_hash
    return sealed


def _anchors(signer: Signer, sealed: list[Sealed], *seqs: int) -> list[Anchor]:
    return [anchor(q, sealed[q - 1].entry_hash, signer, T0 + timedelta(seconds=q)) for q in seqs]


def _forged(rogue: Signer, seq: int, where: str = "audit.anchors[0]@0") -> Anchor:
    """An anchor the attacker signs with their own key, naming whatever they like."""
    return replace(anchor(seq, bytes([seq % 256]) * 32, rogue, T0), where=where)


class _Snapshot:
    """The database as ``verify_chain`` reads it: the head row, the log in seq order (by
    a named cursor, in batches), and the hashes at the anchors' seqs."""

    def __init__(self, sealed: list[Sealed], head: tuple[int, bytes]) -> None:
        self.sealed = sealed
        self.head = head
        self.anchor_seqs_asked: list[int] = []
        self._rows: list[tuple[Any, ...]] = []

    @staticmethod
    def _row(s: Sealed) -> tuple[Any, ...]:
        e = s.entry
        return (
            e.seq, e.topic, e.partition, e.offset, e.key, e.kafka_timestamp_ms, e.headers, e.ce_id, e.ce_type,
            e.ce_source, e.ce_time, e.ce_correlationid, e.ce_causationid, e.record_type, e.value, e.value_json,
            e.decode_error, e.recorded_at, s.prev_hash, s.entry_hash, s.signature, s.key_id, e.verified_by,
            e.unverified,
        )  # fmt: skip

    # the connection
    @contextmanager
    def transaction(self) -> Iterator[None]:
        yield

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> SimpleNamespace:
        if sql.startswith("SET TRANSACTION"):
            return SimpleNamespace()
        if "FROM audit_chain_head" in sql:
            return SimpleNamespace(fetchone=lambda: self.head)
        if "WHERE seq = ANY" in sql:
            (seqs,) = params
            self.anchor_seqs_asked = list(seqs)
            found = [(s.entry.seq, s.entry_hash) for s in self.sealed if s.entry.seq in set(seqs)]
            return SimpleNamespace(fetchall=lambda: found)
        if "FROM audit_log ORDER BY seq" in sql:  # the named cursor's query
            self._rows = [self._row(s) for s in self.sealed]
            return SimpleNamespace()
        raise AssertionError(f"unexpected SQL: {sql}")

    @contextmanager
    def cursor(self, name: str) -> Iterator[_Snapshot]:
        yield self

    def fetchmany(self, n: int) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows[:n], self._rows[n:]
        return rows

    # the pool
    @contextmanager
    def connection(self) -> Iterator[_Snapshot]:
        yield self


def _verify(
    trusted: Keyring, sealed: list[Sealed], published: list[Anchor], head: Sealed | None = None
) -> tuple[dict[str, Any], _Snapshot]:
    last = head or sealed[-1]
    db = _Snapshot(sealed, (last.entry.seq, last.entry_hash))
    ctx = cast(Any, SimpleNamespace(pool=db))
    return verify_chain(ctx, trusted, lambda: published, batch=2), db


def test_a_forged_anchor_at_seq_1_before_the_real_ones_leaves_a_sound_log_sound(
    keys: tuple[Signer, Keyring, Signer],
) -> None:
    signer, trusted, rogue = keys
    sealed = _chain(signer, 6)
    published: list[Anchor] = [_forged(rogue, 1), *_anchors(signer, sealed, 2, 4, 6)]
    verdict, db = _verify(trusted, sealed, published)
    assert verdict["ok"] is True and verdict["firstBroken"] is None, verdict
    assert verdict["anchors"] == {"checked": 3, "newestSeq": 6, "contradicted": 0}  # every real one checked
    untrusted = verdict["untrustedAnchors"]
    assert untrusted["count"] == 1 and untrusted["byReason"] == {UNTRUSTED_KEY: 1}
    (listed,) = untrusted["first"]
    assert listed["seq"] == 1 and listed["keyId"] == rogue.key_id and listed["reason"] == UNTRUSTED_KEY
    assert listed["where"] == "audit.anchors[0]@0" and "not trusted" in listed["problem"]
    assert db.anchor_seqs_asked == [2, 4, 6]  # the forged seq is not even looked up


def test_a_forged_anchor_cannot_hide_a_cut_tail(keys: tuple[Signer, Keyring, Signer]) -> None:
    """The owner cuts entries 5-6 and rewrites the head to 4 (the chain alone is
    consistent), and publishes forged anchors: the one at seq 1 that used to stop the
    check, and one "covering" the cut log's head. The real anchor at 6 still speaks."""
    signer, trusted, rogue = keys
    sealed = _chain(signer, 6)
    real = _anchors(signer, sealed, 3, 6)
    cover = anchor(4, sealed[3].entry_hash, rogue, T0 + timedelta(minutes=1))
    cut = sealed[:4]
    before, _ = _verify(trusted, cut, [*real])
    verdict, _ = _verify(trusted, cut, [_forged(rogue, 1), *real, cover])
    assert verdict["ok"] is False and verdict["entriesChecked"] == 4
    assert verdict["firstBroken"]["seq"] == 5 and "tail was cut" in verdict["firstBroken"]["problem"]
    assert verdict["firstBroken"] == before["firstBroken"]  # the forgeries change nothing
    assert verdict["anchors"] == {"checked": 2, "newestSeq": 6, "contradicted": 1}
    assert verdict["untrustedAnchors"]["count"] == 2


def test_a_cut_after_the_forged_anchor_is_told_apart_from_an_earlier_cut(
    keys: tuple[Signer, Keyring, Signer],
) -> None:
    """Before the fix both verdicts were "broken at 1" (the forged anchor): now each
    names its own cut."""
    signer, trusted, rogue = keys
    sealed = _chain(signer, 8)
    published: list[Anchor] = [_forged(rogue, 1), *_anchors(signer, sealed, 4, 8)]
    early, _ = _verify(trusted, sealed[:3], published)
    late, _ = _verify(trusted, sealed[:6], published)
    assert (early["ok"], early["firstBroken"]["seq"]) == (False, 4)
    assert (late["ok"], late["firstBroken"]["seq"]) == (False, 7)


def test_a_trusted_key_id_with_a_bad_signature_is_untrusted(keys: tuple[Signer, Keyring, Signer]) -> None:
    signer, trusted, rogue = keys
    sealed = _chain(signer, 5)
    genuine = _anchors(signer, sealed, 5)
    # The real key id, signed by the rogue key; and a real anchor with its claim edited
    # (it would say the log had 9 entries: a "cut" of a sound log).
    borrowed = replace(_forged(rogue, 2), key_id=signer.key_id)
    edited = replace(genuine[0], seq=9, where="audit.anchors[0]@7")
    verdict, _ = _verify(trusted, sealed, [borrowed, *genuine, edited])
    assert verdict["ok"] is True, verdict
    assert verdict["anchors"]["checked"] == 1
    untrusted = verdict["untrustedAnchors"]
    assert untrusted["byReason"] == {BAD_SIGNATURE: 2}
    assert [(a["seq"], a["keyId"]) for a in untrusted["first"]] == [(2, signer.key_id), (9, signer.key_id)]
    assert all("does not verify" in a["problem"] for a in untrusted["first"])


def test_forged_anchors_cannot_make_a_sound_log_look_rewritten_or_disagreeing(
    keys: tuple[Signer, Keyring, Signer],
) -> None:
    signer, trusted, rogue = keys
    sealed = _chain(signer, 4)
    genuine = _anchors(signer, sealed, 2, 4)
    other_hash = anchor(2, b"\x07" * 32, rogue, T0)  # "entry 2 was something else"
    relabelled = replace(other_hash, key_id=signer.key_id)
    verdict, _ = _verify(trusted, sealed, [other_hash, relabelled, *genuine])
    assert verdict["ok"] is True and verdict["anchors"]["checked"] == 2
    assert verdict["untrustedAnchors"]["byReason"] == {UNTRUSTED_KEY: 1, BAD_SIGNATURE: 1}


def test_malformed_records_are_untrusted_never_a_verdict(keys: tuple[Signer, Keyring, Signer]) -> None:
    signer, trusted, _ = keys
    sealed = _chain(signer, 3)
    zero = anchor(0, GENESIS, signer, T0)  # genuinely signed, but names no entry
    short = anchor(2, b"\x01" * 8, signer, T0)
    naive = replace(_anchors(signer, sealed, 3)[0], anchored_at=datetime(2025, 3, 1))
    huge_kid = replace(_anchors(signer, sealed, 3)[0], key_id="k" * 5000)
    junk = unreadable_anchor("audit.anchors[0]@3", "it does not decode: unknown magic byte")
    verdict, _ = _verify(trusted, sealed, [zero, short, naive, junk, huge_kid, *_anchors(signer, sealed, 3)])
    assert verdict["ok"] is True, verdict
    untrusted = verdict["untrustedAnchors"]
    assert untrusted["count"] == 5 and untrusted["byReason"] == {MALFORMED: 4, UNTRUSTED_KEY: 1}
    assert untrusted["first"][3] == {
        "seq": None,
        "keyId": None,
        "where": "audit.anchors[0]@3",
        "reason": MALFORMED,
        "problem": "it does not decode: unknown magic byte",
    }
    assert len(untrusted["first"][4]["keyId"]) < 50  # an attacker's key id is not echoed whole


def test_every_trusted_anchor_is_checked_past_the_first_contradiction(
    keys: tuple[Signer, Keyring, Signer],
) -> None:
    """Entry 5 rewritten and the chain re-signed with the real key: the anchors at 5 and
    6 contradict the log, and the check does not stop at the first of them."""
    signer, trusted, _ = keys
    sealed = _chain(signer, 6)
    published = _anchors(signer, sealed, 2, 3, 5, 6)
    rebuilt, previous = [], GENESIS
    for seq in range(1, 7):
        changed = replace(_entry(seq), value_json='{"replicas":0}') if seq == 5 else _entry(seq)
        item = seal(previous, changed, signer)
        rebuilt.append(item)
        previous = item.entry_hash
    result = check_anchors(published, trusted, 6, {s.entry.seq: s.entry_hash for s in rebuilt})
    assert (result.checked, result.contradicted, result.newest_seq) == (4, 2, 6)
    assert result.broken is not None and result.broken.seq == 5 and "rewritten" in result.broken.problem
    verdict, _ = _verify(trusted, rebuilt, [*published])
    assert verdict["ok"] is False and verdict["entriesChecked"] == 6  # the chain alone is consistent
    assert verdict["firstBroken"]["seq"] == 5 and verdict["anchors"]["contradicted"] == 2


def test_a_sound_log_is_sound(keys: tuple[Signer, Keyring, Signer]) -> None:
    signer, trusted, _ = keys
    sealed = _chain(signer, 5)
    verdict, _ = _verify(trusted, sealed, [*_anchors(signer, sealed, 1, 3, 5)])
    assert verdict["ok"] is True and verdict["firstBroken"] is None
    assert (verdict["entriesChecked"], verdict["lastSeq"]) == (5, 5)
    assert verdict["anchors"] == {"checked": 3, "newestSeq": 5, "contradicted": 0}
    assert verdict["untrustedAnchors"] == {"count": 0, "byReason": {}, "first": []}
    assert verdict["trustedKeys"] == [signer.key_id]


def test_a_flood_of_forged_anchors_is_counted_and_listed_in_part(keys: tuple[Signer, Keyring, Signer]) -> None:
    signer, trusted, rogue = keys
    sealed = _chain(signer, 2)
    flood: list[Anchor] = [_forged(rogue, q, f"audit.anchors[0]@{q}") for q in range(1, 40)]
    verdict, db = _verify(trusted, sealed, [*flood, *_anchors(signer, sealed, 2)])
    assert verdict["ok"] is True and verdict["untrustedAnchors"]["count"] == 39
    assert [a["seq"] for a in verdict["untrustedAnchors"]["first"]] == list(range(1, UNTRUSTED_LISTED + 1))
    assert db.anchor_seqs_asked == [2]
