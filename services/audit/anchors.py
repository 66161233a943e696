"""Anchoring the chain head outside the database, and reading the anchors back.

The log's owner can rewrite the log: truncate its tail, or (with the signing key)
re-sign a rebuilt chain, and the chain would still be consistent with itself. Kafka's
log is append-only for everyone but its administrators, so every few seconds — when the
log has grown — the audit service publishes the head (last seq and its hash), signed, to
``audit.anchors`` through its outbox like every record it publishes. ``/verify`` reads
every anchor back and holds the log against each one signed by a trusted key
(:func:`services.audit.chain.check_anchors`); whatever else is on the topic (an unknown
key, a signature that does not verify, a record that is no anchor) is reported as
untrusted and changes no verdict.

What that leaves: entries recorded after the newest anchor (at most one period, 5 s) can
be cut without a trace; and whoever holds the signing key *and* can delete records from
``audit.anchors`` can rewrite anything. Someone with the key alone can publish anchors of
a rewritten log, but the old anchors stay and disagree with them.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime

from confluent_kafka import Consumer, TopicPartition

from flotilla import AvroSerde, KafkaTarget, SerdeError, ServiceContext, kafka_connection
from flotilla.records import ChainAnchored
from services.audit.chain import Anchor, Signer, anchor, unreadable_anchor

log = logging.getLogger(__name__)

CHAIN = "audit"  # the key and correlation id of every anchor: one chain

ANCHOR_MIGRATION = """
CREATE TABLE IF NOT EXISTS audit_anchors (
    seq         bigint      PRIMARY KEY,
    entry_hash  bytea       NOT NULL,
    event_id    uuid        NOT NULL,
    anchored_at timestamptz NOT NULL
);
"""


def publisher(signer: Signer, topic: str) -> Callable[[ServiceContext], None]:
    """The periodic task: anchor the head when it moved since the last anchor."""

    def anchor_the_head(ctx: ServiceContext) -> None:
        with ctx.pool.connection() as conn, conn.transaction():
            head = conn.execute("SELECT seq, hash FROM audit_chain_head WHERE id = 1 FOR SHARE").fetchone()
            last = conn.execute("SELECT max(seq) FROM audit_anchors").fetchone()
            if head is None or int(head[0]) == 0 or (last is not None and last[0] == head[0]):
                return
            made = anchor(int(head[0]), bytes(head[1]), signer, ctx.now())
            envelope = ctx.emit(conn, _record(made), key=CHAIN, correlation=CHAIN, topic=topic)
            conn.execute(
                "INSERT INTO audit_anchors (seq, entry_hash, event_id, anchored_at) VALUES (%s, %s, %s, %s)",
                (made.seq, made.entry_hash, envelope.id, made.anchored_at),
            )
        log.debug("anchored the audit chain at entry %d", made.seq)

    return anchor_the_head


def _record(made: Anchor) -> ChainAnchored:
    return ChainAnchored(
        seq=made.seq,
        entry_hash=made.entry_hash,
        key_id=made.key_id,
        anchored_at=made.anchored_at,
        signature=made.signature,
    )


class AnchorsUnavailable(Exception):
    """The anchors could not be read (Kafka did not answer): no verdict can be given."""


def read_anchors(bootstrap: KafkaTarget, topic: str, serde: AvroSerde, timeout: float = 10.0) -> list[Anchor]:
    """Every record on ``topic``, from its start to the end it had when asked: an anchor,
    or (:func:`~services.audit.chain.unreadable_anchor`) what made it none, for
    ``/verify`` to report. Nothing here is trusted yet."""
    consumer = Consumer(
        {**kafka_connection(bootstrap), "group.id": f"audit-verify-{uuid.uuid4()}", "enable.auto.commit": False}
    )
    try:
        try:
            partitions = consumer.list_topics(topic, timeout=timeout).topics[topic].partitions
            ends = {}
            for p in partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
                if high > low:
                    ends[p] = (low, high)
        except Exception as exc:
            raise AnchorsUnavailable(f"cannot read {topic}: {exc}") from exc
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in ends.items()])
        anchors: list[Anchor] = []
        remaining = {p: high for p, (_, high) in ends.items()}
        deadline = datetime.now().timestamp() + timeout
        while remaining:
            if datetime.now().timestamp() > deadline:
                raise AnchorsUnavailable(f"{topic}: not read to its end within {timeout:.0f} s")
            msg = consumer.poll(0.2)
            # Done at the end offset by position, not by the last record's offset: Kafka
            # Connect publishes exactly-once, and each transaction's commit marker takes
            # an offset after its records that no record ever carries.
            for tp in consumer.position([TopicPartition(topic, p) for p in remaining]):
                if tp.offset >= remaining[tp.partition]:
                    remaining.pop(tp.partition)
            if msg is None or msg.error():
                continue
            where = f"{topic}[{msg.partition()}]@{msg.offset()}"
            try:
                decoded = serde.deserialize(msg.value(), topic=topic)
            except SerdeError as exc:  # someone else's bytes on the topic: no anchor (and not a verdict)
                log.warning("%s is not an anchor: %s", where, exc)
                anchors.append(unreadable_anchor(where, f"it does not decode: {exc}"[:300]))
                continue
            if decoded.record_name != ChainAnchored.TYPE:
                log.warning("%s is a %s, not an anchor", where, decoded.record_name)
                anchors.append(unreadable_anchor(where, f"it is a {str(decoded.record_name)[:200]}, not an anchor"))
                continue
            try:
                found = ChainAnchored.from_value(decoded.value)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("%s is not a readable anchor: %s", where, exc)
                anchors.append(unreadable_anchor(where, f"it is not a readable anchor: {exc}"[:300]))
                continue
            anchors.append(Anchor(found.seq, found.entry_hash, found.key_id, found.anchored_at, found.signature, where))
        return anchors
    finally:
        consumer.close()
