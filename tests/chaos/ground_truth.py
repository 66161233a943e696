"""The invariants of a chaos run, checked against ground truth — never against logs.

Ground truth is what each part keeps as its own record of what happened: the health
agent's incidents, the audit's projection and chain, every service's outbox, the records
on the topics themselves (read committed, from the offsets the run started at), the
sim's ledger of requests and applications per idempotency key, the DLQ reconciler's
quarantine. Each check returns its counts and the offending items, so a failure says
what was lost or doubled, not just that something was.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from flotilla.fleet import AGENTS, AUDIT, DLQ_RECONCILER, EXECUTOR, HEALTH, SIM, url
from flotilla.records import CompensationCompleted
from flotilla.serde import AvroSerde, SerdeError
from flotilla.settings import StackSettings, kafka_connection
from tests.chaos import db
from tests.chaos.config import REPO_ROOT
from tests.chaos.http import call
from tests.support.scripts import load_script

# Where an incident may end: resolved, compensated after a failed recovery, or handed to
# people. Anything else after the drain is an incident the fleet lost track of.
SETTLED = frozenset({"RESOLVED", "COMPENSATED", "ESCALATED"})
COMPENSATE_SUFFIX = ":compensate"

Offsets = dict[tuple[str, int], int]


# The fleet's topics (the integration tests' scratch topics on the same broker are not).
FLEET_TOPICS = ("incidents", "commands", "incidents.dlq", "commands.dlq", "audit.anchors")
ANCHORS = "audit.anchors"  # the audit's own output: not audited, it is what seals the audit


def topics(stack: StackSettings) -> list[str]:
    """The fleet's topics that exist on the broker."""
    admin = AdminClient(kafka_connection(stack.kafka_bootstrap))
    names = admin.list_topics(timeout=30).topics
    return [t for t in FLEET_TOPICS if t in names]


def end_offsets(stack: StackSettings, names: list[str]) -> Offsets:
    """Each partition's end offset now: where the run's records start."""
    consumer = Consumer({**kafka_connection(stack.kafka_bootstrap), "group.id": "chaos-offsets"})
    try:
        ends: Offsets = {}
        for name in names:
            for partition in consumer.list_topics(name, timeout=30).topics[name].partitions:
                ends[(name, partition)] = consumer.get_watermark_offsets(TopicPartition(name, partition), timeout=30)[1]
        return ends
    finally:
        consumer.close()


@dataclass(frozen=True)
class TopicRecord:
    topic: str
    partition: int
    offset: int
    headers: dict[str, str]
    value: bytes | None

    @property
    def ce_id(self) -> str | None:
        return self.headers.get("ce_id")


def read_since(stack: StackSettings, start: Offsets, *, only_named: bool = False) -> list[TopicRecord]:
    """Every committed record from ``start`` on, up to each partition's end now
    (transactions read committed): on every partition of the topics it names, a
    partition it does not name from 0 (created during the run) — or not at all with
    ``only_named``."""
    consumer = Consumer(
        {
            **kafka_connection(stack.kafka_bootstrap),
            "group.id": "chaos-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        names = sorted({t for t, _ in start})
        assignment, ends = [], {}
        for name in names:
            for partition in consumer.list_topics(name, timeout=30).topics[name].partitions:
                if only_named and (name, partition) not in start:
                    continue
                tp = TopicPartition(name, partition, start.get((name, partition), 0))
                ends[(name, partition)] = consumer.get_watermark_offsets(tp, timeout=30)[1]
                if ends[(name, partition)] > tp.offset:
                    assignment.append(tp)
        consumer.assign(assignment)
        remaining = {(tp.topic, tp.partition) for tp in assignment}
        out: list[TopicRecord] = []
        idle = 0
        while remaining and idle < 20:
            msgs = consumer.consume(500, timeout=1.0)
            idle = idle + 1 if not msgs else 0
            for msg in msgs:
                if msg.error():
                    continue
                key = (msg.topic() or "", msg.partition() or 0)
                headers = {k: v.decode(errors="replace") for k, v in (msg.headers() or []) if v is not None}
                out.append(TopicRecord(key[0], key[1], msg.offset() or 0, headers, msg.value()))
            # transaction markers occupy offsets too: a partition is done at its end offset
            for tp in consumer.position([TopicPartition(t, p) for t, p in remaining]):
                if tp.offset >= ends[(tp.topic, tp.partition)]:
                    remaining.discard((tp.topic, tp.partition))
        return out
    finally:
        consumer.close()


@dataclass
class Check:
    name: str
    counts: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        figures = ", ".join(f"{k} {v}" for k, v in self.counts.items())
        verdict = "ok" if self.ok else f"FAILED: {len(self.problems)} — {'; '.join(self.problems[:5])}"
        return f"{self.name}: {figures} — {verdict}"


def incidents_settled(stack: StackSettings, started: datetime) -> tuple[Check, dict[str, str]]:
    """Every incident the health agent opened in the run is settled in the audit's view."""
    opened = sorted(opened_since(stack, started))
    status = dict(
        db.rows(
            stack.pg_dsn(AUDIT.database),
            "SELECT incident_id, status FROM audit_incidents WHERE incident_id = ANY(%s)",
            (opened,),
        )
    )
    check = Check("every incident settled")
    check.counts["incidents"] = len(opened)
    for name, n in sorted(Counter(status.get(i, "UNSEEN") for i in opened).items()):
        check.counts[name] = n
    check.problems = [f"{i} is {status.get(i, 'unseen by audit')}" for i in opened if status.get(i) not in SETTLED]
    return check, status


def compensated(stack: StackSettings, incidents: list[str]) -> set[str]:
    """The incidents whose recovery the executor undid (a CompensationCompleted in the audit's
    log), whatever came after it (an escalation, when the service still breached)."""
    rows = db.rows(
        stack.pg_dsn(AUDIT.database),
        "SELECT DISTINCT ce_correlationid FROM audit_log WHERE ce_type = %s AND ce_correlationid = ANY(%s)",
        (CompensationCompleted.TYPE, incidents),
    )
    return {str(r[0]) for r in rows}


def action_counts(executor_token: str) -> dict[str, dict[str, int]]:
    answer = call("GET", f"{url(SIM)}/action-counts", token=executor_token)
    keys: dict[str, dict[str, int]] = answer["keys"]
    return keys


def applied_once(counts: dict[str, dict[str, int]]) -> Check:
    """At the sim: no key applied twice, and no incident acted on by two proposals (two
    agents' plans both carried out would be the fight over one resource we exist to stop)."""
    check = Check("sim: each key applied at most once, one proposal acted on per incident")
    check.counts["keys"] = len(counts)
    check.counts["applied"] = sum(c["applied"] for c in counts.values())
    check.counts["repeated requests"] = sum(c["requests"] - 1 for c in counts.values() if c["requests"] > 1)
    check.problems = [f"{k} applied {c['applied']}×" for k, c in counts.items() if c["applied"] > 1]
    proposals: defaultdict[str, set[str]] = defaultdict(set)
    for key, c in counts.items():
        if c["applied"] and not key.endswith(COMPENSATE_SUFFIX):
            incident, proposal = key.split(":", 2)[:2]
            proposals[incident].add(proposal)
    check.problems += [f"incident {i} acted on by {len(p)} proposals" for i, p in proposals.items() if len(p) > 1]
    return check


def approved_applied(
    records: list[TopicRecord], serde: AvroSerde, counts: dict[str, dict[str, int]], incidents: set[str]
) -> Check:
    """Every command the policy service issued in the run (on ``commands``) is for one of
    the run's ``incidents`` and applied exactly once. A command for an incident opened
    before the run means state the soak inherited was acted on (issue 31)."""
    keys, foreign = set(), set()
    for record in records:
        if record.topic != "commands" or record.value is None:
            continue
        try:
            value = serde.deserialize(record.value).value
        except SerdeError:
            continue  # injected poison
        if isinstance(value, dict) and value.get("idempotencyKey"):
            key = str(value["idempotencyKey"])
            (keys if value.get("incidentId") in incidents else foreign).add(key)
    check = Check("every approved command applied exactly once")
    check.counts["commands"] = len(keys)
    check.counts["applied once"] = sum(1 for k in keys if counts.get(k, {}).get("applied") == 1)
    check.counts["commands for incidents from before the run"] = len(foreign)
    check.problems = [
        f"{k} applied {counts.get(k, {}).get('applied', 0)}×"
        for k in sorted(keys)
        if counts.get(k, {}).get("applied") != 1
    ]
    check.problems += [f"{k}: a command for an incident the run did not open" for k in sorted(foreign)]
    return check


def opened_since(stack: StackSettings, started: datetime) -> set[str]:
    """The incidents the health agent opened since ``started``: the run's own."""
    return {
        str(r[0])
        for r in db.rows(
            stack.pg_dsn(HEALTH.database), "SELECT incident_id FROM health_incidents WHERE opened_at >= %s", (started,)
        )
    }


def outbox_delivered(stack: StackSettings, started: datetime, records: list[TopicRecord], *, until: datetime) -> Check:
    """Every outbox row of every service written between ``started`` and ``until`` is on its
    topic, by event id: exactly once with exactly-once delivery; at least once with
    at-least-once (flotilla.delivery), each further copy counted and an exact copy of the
    first (the same value and headers: a re-publication, not another event under its id).
    ``until`` comes before ``records`` were read: a row written while they were read (the
    audit anchors its chain every few seconds) is not expected among them."""
    copies: dict[tuple[str, str], list[TopicRecord]] = defaultdict(list)
    for r in records:
        if r.ce_id:
            copies[(r.topic, r.ce_id)].append(r)
    exactly_once = stack.outbox_delivery == "exactly-once"
    check = Check(f"every outbox row on its topic {'exactly' if exactly_once else 'at least'} once")
    rows = duplicates = 0
    for member in AGENTS:
        assert member.database is not None
        for event_id, topic in db.rows(
            stack.pg_dsn(member.database),
            "SELECT id::text, aggregatetype FROM outbox WHERE created_at >= %s AND created_at < %s",
            (started, until),
        ):
            rows += 1
            found = copies.get((topic, event_id), [])
            duplicates += max(0, len(found) - 1)
            if not found or (exactly_once and len(found) > 1):
                check.problems.append(f"{member.name} row {event_id} is on {topic} {len(found)}×")
            elif any((c.value, c.headers) != (found[0].value, found[0].headers) for c in found[1:]):
                check.problems.append(f"{member.name} row {event_id}: a copy on {topic} differs from the first")
    check.counts["rows"] = rows
    check.counts["duplicates"] = duplicates
    check.counts["topic records"] = len(records)
    return check


def audit_complete(stack: StackSettings, records: list[TopicRecord]) -> Check:
    """The audit holds every record of the run once (by topic position and by event id),
    and nothing twice (its own anchors aside)."""
    records = [r for r in records if r.topic != ANCHORS]
    positions = [(r.topic, r.partition, r.offset) for r in records]
    logged = Counter(
        (t, p, o)
        for t, p, o in db.rows(
            stack.pg_dsn(AUDIT.database),
            'SELECT topic, partition, "offset" FROM audit_log WHERE (topic, partition, "offset") IN '
            "(SELECT * FROM unnest(%s::text[], %s::int[], %s::bigint[]))",
            ([t for t, _, _ in positions], [p for _, p, _ in positions], [o for _, _, o in positions]),
        )
    )
    # An exact copy of an earlier record (a re-published outbox row) is an entry marked as
    # its redelivery: the event is still entered once.
    entered = db.rows(
        stack.pg_dsn(AUDIT.database),
        "SELECT topic, ce_id, redelivery_of IS NOT NULL FROM audit_log WHERE ce_id = ANY(%s)",
        ([r.ce_id for r in records if r.ce_id],),
    )
    ids = Counter((t, i) for t, i, copy in entered if not copy)
    check = Check("audit: every record once, no duplicate entries")
    check.counts["records"] = len(positions)
    check.counts["entries"] = sum(logged.values())
    check.counts["redeliveries"] = sum(1 for *_, copy in entered if copy)
    check.problems = [f"{pos} audited {logged[pos]}×" for pos in positions if logged[pos] != 1]
    # A dead letter keeps its original's id, and each consumer that refuses a record
    # writes its own: on a DLQ one id on several records is expected, elsewhere a double.
    check.problems += [
        f"event {i} on {t} audited {n}×" for (t, i), n in ids.items() if n > 1 and not t.endswith(".dlq")
    ]
    return check


def audit_chain() -> Check:
    verdict: dict[str, Any] = call("GET", f"{url(AUDIT)}/verify", patience=120, timeout=300)
    check = Check("audit chain verifies")
    check.counts["entries"] = int(verdict["entriesChecked"])
    check.counts["anchors"] = int(verdict["anchors"]["checked"])
    if verdict["ok"] is not True:
        check.problems.append(f"first broken: {verdict['firstBroken']}")
    return check


def dlq_only_poison(stack: StackSettings, started: datetime, poison: dict[str, tuple[str, int, int]]) -> Check:
    """The DLQ holds the injected poison and nothing else; every poison record is there."""
    quarantined = db.rows(
        stack.pg_dsn(DLQ_RECONCILER.database),
        "SELECT original_event_id, origin_topic, origin_partition, origin_offset, consumer, reason FROM quarantine"
        " WHERE quarantined_at >= %s",
        (started,),
    )
    positions = {v: k for k, v in poison.items()}
    check = Check("DLQ: only the injected poison")
    check.counts["quarantined"] = len(quarantined)
    check.counts["poison"] = len(poison)
    found = set()
    for event_id, topic, partition, offset, consumer, reason in quarantined:
        which = event_id if event_id in poison else positions.get((topic, partition, offset))
        if which is None:
            check.problems.append(f"{consumer} dead-lettered {event_id} ({topic}/{partition}@{offset}): {reason}")
        else:
            found.add(which)
    check.problems += [f"poison {p} never quarantined" for p in sorted(set(poison) - found)]
    return check


def executor_settled(stack: StackSettings) -> Check:
    """No execution left PENDING: every action the executor started, it finished."""
    pending = db.rows(stack.pg_dsn(EXECUTOR.database), "SELECT idempotency_key FROM executions WHERE state = 'PENDING'")
    check = Check("executor: nothing left pending")
    check.counts["pending"] = len(pending)
    check.problems = [f"{k} still PENDING" for (k,) in pending]
    return check


def transactions_closed(stack: StackSettings, started: datetime, settle_seconds: float = 30) -> Check:
    """No partition of the broker is left with an open transaction: each one's last stable
    offset reaches its high watermark (a transaction still running may hold it back for a
    moment, so one whose LSO still moves within ``settle_seconds`` passes). Counts what the
    stack's transaction watchdog aborted during the run (infra/local/txn_watchdog.py)."""
    stackctl = load_script("_chaos_stackctl", REPO_ROOT / "infra" / "local" / "stackctl.py")
    watchdog = load_script("_chaos_txn_watchdog", REPO_ROOT / "infra" / "local" / "txn_watchdog.py")
    admin = AdminClient(kafka_connection(stack.kafka_bootstrap))
    first, _ = watchdog.read_offsets(admin)
    deadline = time.monotonic() + settle_seconds
    snapshot = first
    while any(o.open_transaction for o in snapshot.values()) and time.monotonic() < deadline:
        time.sleep(2)
        snapshot, _ = watchdog.read_offsets(admin)
    check = Check("no transaction left open on a partition")
    check.counts["partitions"] = len(snapshot)
    aborted = watchdog.read_record(stackctl.TXN_WATCHDOG_RECORD, since=started.timestamp())
    check.counts["hanging aborted by the watchdog"] = len(aborted)
    check.problems = [
        f"{topic}-{partition}: LSO {o.stable} < high watermark {o.high}"
        for (topic, partition), o in sorted(snapshot.items())
        if o.open_transaction and first.get((topic, partition)) == o
    ]
    return check
