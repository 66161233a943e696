"""The tamper-evident chain: canonical entries, hash links, signatures, verification.

Every audit entry is reduced to one canonical byte string (:func:`canonical`): a JSON
object of *every* stored column that the service serves, keys sorted, no whitespace,
ASCII only, bytes as base64 and times as ISO 8601 in UTC with microseconds. The entry's
hash is ``SHA-256(previous hash || canonical entry)`` (the first entry links to 32 zero
bytes), so changing, removing or reordering any entry breaks every link after it. The
hash is signed with the service's Ed25519 key, so a person with write access to the
database but not the key cannot recompute a consistent chain after an edit.

This module is pure (no database, no Kafka): the recorder writes with it, the
``/verify`` endpoint and the tests check with it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from flotilla.keys import Keyring, key_id

GENESIS = bytes(32)


@dataclass(frozen=True)
class Entry:
    """One audited record as stored (hash, link and signature apart)."""

    seq: int
    topic: str
    partition: int
    offset: int
    key: bytes | None
    kafka_timestamp_ms: int | None
    headers: str  # canonical JSON of the record's headers, in order (see headers_json)
    ce_id: str | None
    ce_type: str | None
    ce_source: str | None
    ce_time: str | None
    ce_correlationid: str | None
    ce_causationid: str | None
    record_type: str | None
    value: bytes | None  # the record's value exactly as it was on the topic
    value_json: str | None  # the decoded value (canonical JSON), when it decoded
    decode_error: str | None
    recorded_at: datetime
    # The producer's signature, checked as every fleet consumer checks it
    # (flotilla.provenance): the member that signed, or why the record is not believed.
    # Both None only for entries recorded before the audit checked signatures.
    verified_by: str | None = None
    unverified: str | None = None


# Entry fields added after entries were first sealed: left out of the canonical form while
# None, so the entries sealed before them keep their hashes (a later entry always has one).
_LATER_FIELDS = ("verified_by", "unverified")


def _encode(value: object) -> object:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("audit times must be timezone-aware")
        return value.astimezone(UTC).isoformat(timespec="microseconds")
    return value


def canonical(entry: Entry) -> bytes:
    """The one byte string an entry hashes to, whatever order or client read it."""
    doc = {
        name: _encode(value) for name, value in asdict(entry).items() if not (value is None and name in _LATER_FIELDS)
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def link(previous: bytes, entry: Entry) -> bytes:
    """This entry's hash: SHA-256 over the previous entry's hash and its canonical form."""
    return hashlib.sha256(previous + canonical(entry)).digest()


def headers_json(headers: Iterable[tuple[str, bytes | None]]) -> str:
    """Headers as canonical JSON: ``[{"name", "value"}]`` for UTF-8 text without NULs,
    ``[{"name", "base64"}]`` otherwise, ``value: null`` for a header without a value."""
    items: list[dict[str, str | None]] = []
    for name, raw in headers:
        if raw is None:
            items.append({"name": name, "value": None})
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None or "\x00" in text:
            items.append({"name": name, "base64": base64.b64encode(raw).decode("ascii")})
        else:
            items.append({"name": name, "value": text})
    return json.dumps(items, separators=(",", ":"), ensure_ascii=True)


class Signer:
    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.public_key = private_key.public_key()
        self.key_id = key_id(self.public_key)

    def sign(self, entry_hash: bytes) -> bytes:
        return self._key.sign(entry_hash)

    def public_pem(self) -> str:
        return self.public_key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode("ascii")


@dataclass(frozen=True)
class Sealed:
    """An entry with what the chain stored beside it."""

    entry: Entry
    prev_hash: bytes
    entry_hash: bytes
    signature: bytes
    key_id: str


def seal(previous: bytes, entry: Entry, signer: Signer) -> Sealed:
    entry_hash = link(previous, entry)
    return Sealed(entry, previous, entry_hash, signer.sign(entry_hash), signer.key_id)


@dataclass(frozen=True)
class Broken:
    seq: int
    problem: str


@dataclass(frozen=True)
class Verification:
    ok: bool
    checked: int
    last_seq: int
    last_hash: bytes
    broken: Broken | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "entriesChecked": self.checked,
            "lastSeq": self.last_seq,
            "lastHash": self.last_hash.hex(),
            "firstBroken": None if self.broken is None else {"seq": self.broken.seq, "problem": self.broken.problem},
        }


class ChainVerifier:
    """Walks sealed entries in seq order; stops at the first broken one.

    Feed it entries (any number of batches) with :meth:`feed`, then :meth:`finish` with
    the chain head the database recorded. Entries are checked against ``trusted`` (the
    configured keys): an entry signed with any other key is broken, whatever it says.
    """

    def __init__(self, trusted: Keyring) -> None:
        self._trusted = trusted
        self._expected_seq = 1
        self._hash = GENESIS
        self._checked = 0
        self.broken: Broken | None = None

    def feed(self, sealed: Iterable[Sealed]) -> bool:
        """Check more entries; False once the chain is broken (stop feeding)."""
        for item in sealed:
            if self.broken is not None:
                return False
            self.broken = self._check(item)
            if self.broken is None:
                self._checked += 1
                self._expected_seq += 1
                self._hash = item.entry_hash
        return self.broken is None

    def _check(self, item: Sealed) -> Broken | None:
        seq = item.entry.seq
        if seq != self._expected_seq:
            return Broken(self._expected_seq, f"entry {self._expected_seq} is missing (next entry found is {seq})")
        if item.prev_hash != self._hash:
            return Broken(seq, "its previous-hash does not link to the entry before it")
        if link(self._hash, item.entry) != item.entry_hash:
            return Broken(seq, "its content does not match its hash (the entry was changed)")
        public = self._trusted.get(item.key_id)
        if public is None:
            return Broken(
                seq, f"it is signed with key {item.key_id}, which is not trusted ({self._trusted.describe()})"
            )
        try:
            public.verify(item.signature, item.entry_hash)
        except InvalidSignature:
            return Broken(seq, "its signature does not verify (the hash was recomputed without the key)")
        return None

    def finish(self, head_seq: int, head_hash: bytes) -> Verification:
        """The verdict, after checking the last entry against the recorded chain head."""
        last_seq = self._expected_seq - 1
        if self.broken is None and (head_seq != last_seq or head_hash != self._hash):
            self.broken = Broken(
                last_seq + 1 if head_seq > last_seq else head_seq,
                f"the chain head says entry {head_seq} is the last, the log ends at entry {last_seq}",
            )
        return Verification(self.broken is None, self._checked, last_seq, self._hash, self.broken)


def verify(sealed: Iterable[Sealed], trusted: Keyring, head_seq: int, head_hash: bytes) -> Verification:
    verifier = ChainVerifier(trusted)
    verifier.feed(sealed)
    return verifier.finish(head_seq, head_hash)


# ------------------------------------------------------------------ anchors

ANCHOR_DOMAIN = b"flotilla/audit-anchor/v1"


@dataclass(frozen=True)
class Anchor:
    """A signed statement, published outside the database: the log had ``seq`` entries,
    the last one hashing to ``entry_hash``."""

    seq: int
    entry_hash: bytes
    key_id: str
    anchored_at: datetime
    signature: bytes
    where: str | None = field(default=None, compare=False)  # topic[partition]@offset, when read
    # Set when the record at ``where`` was no readable anchor (the claims are then empty):
    # why. See :func:`unreadable_anchor`.
    unreadable: str | None = field(default=None, compare=False)

    def message(self) -> bytes:
        return anchor_message(self.seq, self.entry_hash, self.key_id, self.anchored_at)


def anchor_message(seq: int, entry_hash: bytes, kid: str, at: datetime) -> bytes:
    claims = {"seq": seq, "hash": entry_hash.hex(), "keyId": kid, "anchoredAt": _encode(at)}
    return ANCHOR_DOMAIN + b"\n" + json.dumps(claims, sort_keys=True, separators=(",", ":")).encode("ascii")


def anchor(seq: int, entry_hash: bytes, signer: Signer, at: datetime) -> Anchor:
    at = at.astimezone(UTC).replace(microsecond=at.microsecond // 1000 * 1000)  # what timestamp-millis holds
    return Anchor(seq, entry_hash, signer.key_id, at, signer.sign(anchor_message(seq, entry_hash, signer.key_id, at)))


# Why an anchor is not taken as evidence (``UntrustedAnchor.reason``).
MALFORMED = "malformed"
UNTRUSTED_KEY = "untrusted-key"
BAD_SIGNATURE = "bad-signature"

UNTRUSTED_LISTED = 10  # how many untrusted anchors a verdict lists (it counts them all)
_SHOWN = 40  # characters of an untrusted anchor's key id a report repeats (its writer chose it)


def unreadable_anchor(where: str, problem: str) -> Anchor:
    """A record on the anchors topic that is no readable anchor: kept (where it is and
    why) for ``/verify`` to list as untrusted, with no claims."""
    return Anchor(0, b"", "", datetime.fromtimestamp(0, UTC), b"", where, problem)


@dataclass(frozen=True)
class UntrustedAnchor:
    """Something on the anchors topic that is not evidence: not readable, not signed by a
    trusted key, or its signature does not verify. Reported, never a verdict by itself:
    whoever can write the topic can publish one."""

    reason: str  # MALFORMED, UNTRUSTED_KEY or BAD_SIGNATURE
    problem: str
    seq: int | None = None
    key_id: str | None = None
    where: str | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "keyId": self.key_id,
            "where": self.where,
            "reason": self.reason,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class SortedAnchors:
    """The anchors read, split: ``genuine`` (signed by a trusted key, in seq order) are
    evidence; ``untrusted`` (in the order read) are only reported."""

    genuine: tuple[Anchor, ...]
    untrusted: tuple[UntrustedAnchor, ...]

    def seqs(self) -> list[int]:
        """The entries the genuine anchors name: the only ones the log is asked for."""
        return sorted({a.seq for a in self.genuine})


def _shown(kid: str) -> str:
    return kid if len(kid) <= _SHOWN else kid[:_SHOWN] + "…"


def _malformed(item: Anchor) -> str | None:
    if isinstance(item.seq, bool) or not isinstance(item.seq, int) or item.seq < 1:
        return f"its seq {item.seq!r} names no entry (entries start at 1)"
    if not isinstance(item.entry_hash, bytes) or len(item.entry_hash) != 32:
        return "its hash is not 32 bytes"
    if not isinstance(item.signature, bytes) or len(item.signature) != 64:
        return "its signature is not 64 bytes"
    if not isinstance(item.key_id, str):
        return "it names no key id"
    if not isinstance(item.anchored_at, datetime) or item.anchored_at.tzinfo is None:
        return "its time is not a time-zone-aware time"
    return None


def _distrust(item: Anchor, trusted: Keyring) -> UntrustedAnchor | None:
    """Why ``item`` is not evidence, or None when it is genuine."""
    if item.unreadable is not None:
        return UntrustedAnchor(MALFORMED, item.unreadable, where=item.where)
    malformed = _malformed(item)
    if malformed is not None:
        seq = item.seq if isinstance(item.seq, int) and not isinstance(item.seq, bool) else None
        kid = _shown(item.key_id) if isinstance(item.key_id, str) else None
        return UntrustedAnchor(MALFORMED, malformed, seq, kid, item.where)
    kid = _shown(item.key_id)
    public = trusted.get(item.key_id)
    if public is None:
        problem = f"it is signed with key {kid}, which is not trusted ({trusted.describe()})"
        return UntrustedAnchor(UNTRUSTED_KEY, problem, item.seq, kid, item.where)
    try:
        public.verify(item.signature, item.message())
    except InvalidSignature:
        problem = f"it names trusted key {kid}, but its signature does not verify (forged)"
        return UntrustedAnchor(BAD_SIGNATURE, problem, item.seq, kid, item.where)
    return None


def sort_anchors(anchors: Iterable[Anchor], trusted: Keyring) -> SortedAnchors:
    """Split what was read from the anchors topic into evidence and the rest."""
    genuine: list[Anchor] = []
    untrusted: list[UntrustedAnchor] = []
    for item in anchors:
        rejected = _distrust(item, trusted)
        if rejected is None:
            genuine.append(item)
        else:
            untrusted.append(rejected)
    return SortedAnchors(tuple(sorted(genuine, key=lambda a: a.seq)), tuple(untrusted))


@dataclass(frozen=True)
class AnchorCheck:
    """The log held against the anchors published so far.

    ``checked`` counts the genuine anchors held against the log (all of them: a problem
    with one does not stop the others), ``contradicted`` those the log contradicts,
    ``broken`` the first such problem (lowest seq). ``untrusted`` are the anchors that
    were not evidence: listed, never making the verdict broken."""

    checked: int
    newest_seq: int | None
    broken: Broken | None
    untrusted: tuple[UntrustedAnchor, ...] = ()
    contradicted: int = 0

    def as_json(self) -> dict[str, object]:
        return {"checked": self.checked, "newestSeq": self.newest_seq, "contradicted": self.contradicted}

    def untrusted_json(self, listed: int = UNTRUSTED_LISTED) -> dict[str, object]:
        """``count``, ``byReason`` (counts) and the ``first`` few, in the order read."""
        by_reason: dict[str, int] = {}
        for item in self.untrusted:
            by_reason[item.reason] = by_reason.get(item.reason, 0) + 1
        return {
            "count": len(self.untrusted),
            "byReason": by_reason,
            "first": [item.as_json() for item in self.untrusted[:listed]],
        }


def _contradiction(item: Anchor, seen: dict[int, bytes], last_seq: int, hashes: dict[int, bytes]) -> Broken | None:
    if seen.get(item.seq, item.entry_hash) != item.entry_hash:
        return Broken(item.seq, f"two anchors disagree about entry {item.seq}")
    if item.seq > last_seq:
        problem = f"an anchor says entry {item.seq} existed, the log ends at entry {last_seq}: its tail was cut"
        return Broken(last_seq + 1, problem)
    if hashes.get(item.seq) != item.entry_hash:
        problem = f"entry {item.seq} is not the one anchored at {item.anchored_at.isoformat()}: the log was rewritten"
        return Broken(item.seq, problem)
    return None


def hold_anchors(anchors: SortedAnchors, last_seq: int, hashes: dict[int, bytes]) -> AnchorCheck:
    """Every genuine anchor must name an entry the log still has, with that hash.

    ``hashes`` are the log's entry hashes at the genuine anchors' seqs (from the same
    snapshot as ``last_seq``). Anchors are read *before* the snapshot, so an honest log has
    every seq a genuine anchor names. Untrusted anchors are carried into the result only."""
    seen: dict[int, bytes] = {}
    checked = contradicted = 0
    newest: int | None = None
    first: Broken | None = None
    for item in anchors.genuine:
        problem = _contradiction(item, seen, last_seq, hashes)
        seen.setdefault(item.seq, item.entry_hash)
        checked += 1
        newest = item.seq
        if problem is not None:
            contradicted += 1
            first = first or problem
    return AnchorCheck(checked, newest, first, anchors.untrusted, contradicted)


def check_anchors(anchors: Iterable[Anchor], trusted: Keyring, last_seq: int, hashes: dict[int, bytes]) -> AnchorCheck:
    """:func:`sort_anchors` then :func:`hold_anchors`: only anchors signed by a trusted
    key are evidence; every one of them is held against the log."""
    return hold_anchors(sort_anchors(anchors, trusted), last_seq, hashes)
