"""The duplicate-delivery pass: every consumer group re-reads its topics from the start.

With the fleet stopped, each group's committed offsets are set to the oldest record
Kafka still holds; the fleet starts again and works through everything it has already
handled. What it may not do is act: no new outbox row, no new record on a topic, no new
action request at the sim, no new audit entry. Audit anchors are excluded — they are the
audit's clock (a signed chain head every interval), not an effect of any record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from flotilla.fleet import AGENTS, AUDIT, DLQ_RECONCILER
from flotilla.settings import StackSettings, kafka_connection
from tests.chaos import db
from tests.chaos.ground_truth import ANCHORS, Check, action_counts, end_offsets, read_since, topics


def fleet_groups(admin: AdminClient) -> list[str]:
    """The fleet's consumer groups: each service's (its name) and any it derives from it."""
    listed = admin.list_consumer_groups(request_timeout=30).result()
    names = {m.name for m in AGENTS}
    return sorted(g.group_id for g in listed.valid if g.group_id in names or g.group_id.split("-anchors")[0] in names)


def rewind(stack: StackSettings) -> dict[str, int]:
    """Every fleet group back to each partition's oldest record (the fleet must be
    stopped: Kafka refuses to move a group that has members). Partitions per group."""
    admin = AdminClient(kafka_connection(stack.kafka_bootstrap))
    reader = Consumer({**kafka_connection(stack.kafka_bootstrap), "group.id": "chaos-rewind"})
    moved = {}
    try:
        for group in fleet_groups(admin):
            request = [ConsumerGroupTopicPartitions(group)]
            committed = admin.list_consumer_group_offsets(request)[group].result(timeout=30)
            oldest = [
                TopicPartition(tp.topic, tp.partition, reader.get_watermark_offsets(tp, timeout=30)[0])
                for tp in committed.topic_partitions
            ]
            if oldest:
                admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, oldest)])[group].result(
                    timeout=30
                )
            moved[group] = len(oldest)
    finally:
        reader.close()
    return moved


def caught_up(stack: StackSettings, timeout: float) -> dict[str, int]:
    """Until no fleet group has a record left to read; the records each still had at the end.

    Records, not offsets: an exactly-once producer's commit marker takes an offset after
    the last record, and a consumer commits the offset after the record it handled, so
    a group that has read everything still sits one offset short of the end."""
    admin = AdminClient(kafka_connection(stack.kafka_bootstrap))
    reader = Consumer({**kafka_connection(stack.kafka_bootstrap), "group.id": "chaos-lag"})
    deadline = time.monotonic() + timeout
    try:
        while True:
            lag = {}
            for group in fleet_groups(admin):
                request = [ConsumerGroupTopicPartitions(group)]
                committed = admin.list_consumer_group_offsets(request)[group].result(timeout=30)
                positions = {
                    (tp.topic, tp.partition): tp.offset
                    if tp.offset >= 0
                    else reader.get_watermark_offsets(tp, timeout=30)[0]
                    for tp in committed.topic_partitions
                }
                lag[group] = len(read_since(stack, positions, only_named=True))
            if not any(lag.values()) or time.monotonic() > deadline:
                return lag
            time.sleep(2)
    finally:
        reader.close()


@dataclass(frozen=True)
class Effects:
    outbox_rows: int
    topic_records: int
    sim_requests: int
    sim_applied: int
    audit_entries: int
    quarantined: int

    @classmethod
    def now(cls, stack: StackSettings, executor_token: str) -> Effects:
        outbox = 0
        for member in AGENTS:
            assert member.database is not None
            ((n,),) = db.rows(
                stack.pg_dsn(member.database), "SELECT count(*) FROM outbox WHERE aggregatetype <> %s", (ANCHORS,)
            )
            outbox += n
        names = [t for t in topics(stack) if t != ANCHORS]
        counts = action_counts(executor_token)
        ((audited,),) = db.rows(
            stack.pg_dsn(AUDIT.database), "SELECT count(*) FROM audit_log WHERE topic <> %s", (ANCHORS,)
        )
        ((quarantined,),) = db.rows(stack.pg_dsn(DLQ_RECONCILER.database), "SELECT count(*) FROM quarantine")
        return cls(
            outbox_rows=outbox,
            topic_records=sum(end_offsets(stack, names).values()),
            sim_requests=sum(c["requests"] for c in counts.values()),
            sim_applied=sum(c["applied"] for c in counts.values()),
            audit_entries=audited,
            quarantined=quarantined,
        )


def no_new_effects(before: Effects, after: Effects, groups: dict[str, int], lag: dict[str, int]) -> Check:
    check = Check("duplicate delivery: every group re-read everything, nothing new happened")
    check.counts["groups rewound"] = len(groups)
    check.counts["partitions rewound"] = sum(groups.values())
    for name in before.__dataclass_fields__:
        grown = getattr(after, name) - getattr(before, name)
        check.counts[f"new {name.replace('_', ' ')}"] = grown
        if grown:
            check.problems.append(f"{name}: {getattr(before, name)} -> {getattr(after, name)}")
    check.problems += [f"group {g} still {n} behind" for g, n in lag.items() if n]
    return check
