"""The audit log against its owner, on the real stack (security review H4).

The owner of the audit database can switch the append-only trigger off. Three attacks
that leave a chain consistent with itself, and the two defences that catch them:

- truncate the tail and rewrite the head row: caught by an anchor (published to Kafka
  before the cut) naming an entry the log no longer has;
- rebuild the whole log signed with another key: caught by the pinned keys (the verifier
  trusts FLOTILLA_AUDIT_PUBLIC_KEYS, not the key an entry names);
- rebuild it with the audit's own key (stolen): caught by the anchors published before,
  whose hashes the rebuilt log no longer has.

Each test audits a few records into a database and anchors topic of its own.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flotilla_ops.samples import SERVICE_LATENCY_INCREASED, latency_fact

from flotilla.bootstrap import drop_outbox
from flotilla.contracts import Contract, load_contracts, register
from flotilla.keys import Keyring, load_or_create, public_key_text
from flotilla.records import ChainAnchored
from flotilla.runner import ServiceContext, prepare
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from services.audit import service as audit_service
from services.audit.anchors import publisher, read_anchors
from services.audit.api import _COLUMNS, _sealed, verify_chain
from services.audit.chain import GENESIS, Signer, anchor, seal
from services.audit.settings import AuditSettings
from tests.keys import fact_settings
from tests.support.producing import ordered_producer

pytestmark = pytest.mark.timeout(240)


@dataclass
class Audited:
    ctx: ServiceContext
    settings: AuditSettings
    signer: Signer
    trusted: Keyring
    database: str

    def anchors(self) -> Any:
        return read_anchors(self.settings.kafka_client(), self.settings.audit_anchors_topic, self.ctx.serde)

    def verify(self) -> dict[str, Any]:
        return verify_chain(self.ctx, self.trusted, self.anchors)

    def owner(self) -> psycopg.Connection[Any]:
        """The table owner's session, with the append-only trigger off (the attacker)."""
        conn = psycopg.connect(self.ctx.settings.pg_dsn(self.database), autocommit=True)
        conn.execute("ALTER TABLE audit_log DISABLE TRIGGER audit_log_no_update_or_delete")
        return conn


@pytest.fixture()
def audited(
    stack: StackSettings, serde: AvroSerde, registry: SchemaRegistryClient, tmp_path: Path
) -> Iterator[Audited]:
    """Six records audited and anchored at the end."""
    run = uuid.uuid4().hex[:8]
    topic, anchors, database = f"it-aa-{run}", f"it-aa-anchors-{run}", f"flotilla_it_aa_{run}"
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    for fut in admin.create_topics([NewTopic(topic, 1, 1), NewTopic(anchors, 1, 1)]).values():
        fut.result(15)
    contracts = [Contract(topic, c.schema) for c in load_contracts() if c.full_name == SERVICE_LATENCY_INCREASED]
    contracts += [Contract(anchors, c.schema) for c in load_contracts() if c.topic == "audit.anchors"]
    for contract in contracts:
        register(registry, contract)
    key, _ = load_or_create(tmp_path / "audit.pem")
    settings = AuditSettings(
        **stack.model_dump(),
        **fact_settings(),
        service_name=f"it-aa-{run}",
        service_database=database,
        audit_topics=(topic,),
        audit_anchors_topic=anchors,
        audit_signing_key_file=tmp_path / "audit.pem",
        audit_public_keys=[public_key_text(key.public_key())],
        http_port=0,
    )
    signer = settings.signer()
    ctx = prepare(audit_service.build_spec(settings, signer), settings)
    try:
        producer = ordered_producer(stack.kafka_bootstrap)
        for n in range(6):
            value, env = latency_fact(f"incident-aa-{run}-{n}")
            producer.produce(
                topic,
                key=env.correlationid,
                value=serde.serialize(topic, SERVICE_LATENCY_INCREASED, value),
                headers=env.headers(),
            )
        assert producer.flush(15) == 0
        loop = audit_service.raw_loop(ctx, settings, signer)
        deadline = time.monotonic() + 60
        try:
            while count(ctx) < 6:
                assert time.monotonic() < deadline, "six records not audited"
                loop.poll_once()
        finally:
            loop.close()
        audit = Audited(ctx, settings, signer, settings.trusted_keys(signer), database)
        publisher(signer, anchors)(ctx)  # the periodic task, once: anchored at entry 6
        deadline = time.monotonic() + 30
        while not [a for a in audit.anchors() if a.seq == 6]:
            assert time.monotonic() < deadline, "the anchor did not reach Kafka"
            time.sleep(0.2)
        yield audit
    finally:
        ctx.pool.close()
        drop_outbox(stack, database)
        for fut in admin.delete_topics([topic, anchors]).values():
            with contextlib.suppress(Exception):
                fut.result(15)


def count(ctx: ServiceContext) -> int:
    with ctx.pool.connection() as conn:
        row = conn.execute("SELECT count(*) FROM audit_log").fetchone()
    return int(row[0]) if row else 0


def cut_tail(audit: Audited, keep: int) -> None:
    """Delete the entries after ``keep`` and point the head at entry ``keep``: a chain still
    consistent with itself, shorter than the anchors say."""
    with audit.owner() as conn, conn.transaction():
        conn.execute("DELETE FROM audit_log WHERE seq > %s", (keep,))
        (kept,) = conn.execute("SELECT entry_hash FROM audit_log WHERE seq = %s", (keep,)).fetchone() or (None,)
        conn.execute("UPDATE audit_chain_head SET seq = %s, hash = %s WHERE id = 1", (keep, kept))


def rebuild(audit: Audited, signer: Signer) -> None:
    """Rewrite entry 3 and re-link and re-sign every entry with ``signer``, head included:
    a chain perfectly consistent with itself."""
    with audit.owner() as conn, conn.transaction():
        rows = conn.execute(f"SELECT {_COLUMNS} FROM audit_log ORDER BY seq").fetchall()
        previous = GENESIS
        for row in rows:
            entry = _sealed(row).entry
            if entry.seq == 3:
                entry = replace(entry, ce_correlationid="incident-nothing-happened")
            item = seal(previous, entry, signer)
            conn.execute(
                "UPDATE audit_log SET ce_correlationid = %s, prev_hash = %s, entry_hash = %s, signature = %s, "
                "key_id = %s WHERE seq = %s",
                (entry.ce_correlationid, item.prev_hash, item.entry_hash, item.signature, item.key_id, entry.seq),
            )
            previous = item.entry_hash
        conn.execute("UPDATE audit_chain_head SET hash = %s WHERE id = 1", (previous,))


def test_an_honest_log_verifies_against_its_anchors(audited: Audited) -> None:
    verdict = audited.verify()
    assert verdict["ok"] is True, verdict
    assert verdict["anchors"]["checked"] >= 1 and verdict["anchors"]["newestSeq"] == 6
    assert verdict["trustedKeys"] == [audited.signer.key_id]


def test_a_tail_cut_with_the_head_rewritten_is_detected(audited: Audited) -> None:
    cut_tail(audited, keep=4)
    verdict = audited.verify()
    assert verdict["ok"] is False
    assert verdict["entriesChecked"] == 4  # the chain alone is consistent ...
    assert "tail was cut" in verdict["firstBroken"]["problem"]  # ... the anchor says otherwise


def test_a_log_rebuilt_with_another_key_is_detected(audited: Audited) -> None:
    rebuild(audited, Signer(Ed25519PrivateKey.generate()))
    verdict = audited.verify()
    assert verdict["ok"] is False and verdict["firstBroken"]["seq"] == 1
    assert "not trusted" in verdict["firstBroken"]["problem"]


def test_a_log_rebuilt_with_the_stolen_key_is_detected_by_the_earlier_anchor(audited: Audited) -> None:
    rebuild(audited, audited.signer)
    verdict = audited.verify()
    assert verdict["entriesChecked"] == 6  # signed by the trusted key, linked, head matching
    assert verdict["ok"] is False and verdict["firstBroken"]["seq"] == 6
    assert "rewritten" in verdict["firstBroken"]["problem"]


def forge_anchor(audit: Audited, serde: AvroSerde, seq: int) -> None:
    """An anchor written straight to the anchors topic, signed with a key nobody trusts (as
    anyone who can write the topic or the audit's outbox could): it claims entry ``seq``
    has a hash the log never had."""
    rogue = Signer(Ed25519PrivateKey.generate())
    made = anchor(seq, b"\x42" * 32, rogue, datetime.now(UTC))
    value = {
        "eventId": str(uuid.uuid4()),
        "seq": made.seq,
        "entryHash": made.entry_hash,
        "keyId": made.key_id,
        "anchoredAt": made.anchored_at,
        "signature": made.signature,
    }
    topic = audit.settings.audit_anchors_topic
    producer = ordered_producer(audit.settings.kafka_bootstrap)
    producer.produce(topic, key="chain", value=serde.serialize(topic, ChainAnchored.TYPE, value))
    assert producer.flush(15) == 0


def test_a_forged_anchor_neither_breaks_an_honest_log_nor_stops_the_check(audited: Audited, serde: AvroSerde) -> None:
    """Security review 2, N2: one anchor at seq 1 with an unknown key made /verify report
    "broken at 1" for ever and stop checking the anchors after it."""
    forge_anchor(audited, serde, seq=1)
    verdict = audited.verify()
    assert verdict["ok"] is True, verdict
    assert verdict["anchors"]["checked"] >= 1 and verdict["anchors"]["newestSeq"] == 6  # the real one, still checked
    assert verdict["untrustedAnchors"]["count"] == 1
    assert verdict["untrustedAnchors"]["byReason"] == {"untrusted-key": 1}


def test_a_forged_anchor_cannot_hide_a_cut_tail(audited: Audited, serde: AvroSerde) -> None:
    forge_anchor(audited, serde, seq=1)
    cut_tail(audited, keep=4)
    verdict = audited.verify()
    assert verdict["ok"] is False
    assert "tail was cut" in verdict["firstBroken"]["problem"], verdict  # the real anchor at 6, past the forged one
    assert verdict["untrustedAnchors"]["count"] == 1
