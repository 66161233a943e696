"""Abort Kafka transactions that a broker restart left hanging (the local stack's watchdog).

Why this exists: in the chaos soak, Kafka 4.3 (one combined broker/controller) was SIGKILLed
between a Connect task's PrepareCommit and its commit markers. After the restart the
transaction coordinator wrote CompleteCommit, yet the COMMIT markers never reached the two
partitions of that transaction (``incidents``-2 and ``_connect-offsets``-0). A partition with
such an open transaction has a last stable offset (LSO) that never moves again: every
read_committed reader stops there, including Connect's own offsets reader, so all seven
outbox tasks hung in start-up and nothing was published for 45 minutes.

Each interval the watchdog reads every partition's LSO and high watermark (two ListOffsets
requests, cheap). Only when a partition's LSO has sat still below its high watermark for
longer than a live transaction of ours may stay open does it run Kafka's own
``kafka-transactions find-hanging`` (a JVM, so not on every tick), which asks the coordinator
whether it still tracks the transaction, and it aborts only what that tool calls hanging
on a partition it saw stuck itself. Aborting is safe for the outbox: the transaction also
holds Connect's source offset, so Debezium reads those rows again and publishes them in a
new transaction (consumers dedupe by event id).

Run by the stack's supervisord (``stackctl up``); every abort is one JSON line in
``--record`` and in the log.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

log = logging.getLogger("txn-watchdog")

Partition = tuple[str, int]

# Connect's producers use Kafka's default transaction.timeout.ms (60 s) and the coordinator
# sweeps for timed-out transactions every 10 s: an LSO still stuck after that is suspect.
STUCK_AFTER_S = 90.0
# find-hanging only reports transactions open longer than this many minutes (its unit).
MAX_TRANSACTION_MINUTES = 1
# A partition the tool found nothing on is asked about again only after this long, so a
# legitimately long transaction costs one JVM run per period, not one per tick.
RECHECK_AFTER_S = 300.0
TOOL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Offsets:
    """A partition's last stable offset (read_committed end) and high watermark."""

    stable: int
    high: int

    @property
    def open_transaction(self) -> bool:
        return self.stable < self.high


@dataclass
class StuckPartitions:
    """Which partitions' LSO has sat still below the high watermark for too long.

    Fed one snapshot per tick; a partition whose LSO moves, or reaches the high watermark,
    starts over. ``due`` leaves out partitions already asked about within ``recheck_after``.
    """

    stuck_after: float = STUCK_AFTER_S
    recheck_after: float = RECHECK_AFTER_S
    _since: dict[Partition, tuple[int, float]] = field(default_factory=dict)
    _asked: dict[Partition, float] = field(default_factory=dict)

    def observe(self, snapshot: Mapping[Partition, Offsets], now: float) -> list[Partition]:
        """Record a snapshot; return the stuck partitions not asked about recently."""
        for tp in list(self._since):
            if tp not in snapshot:
                self._forget(tp)
        due = []
        for tp, offsets in snapshot.items():
            if not offsets.open_transaction:
                self._forget(tp)
                continue
            stable, since = self._since.get(tp, (offsets.stable, now))
            if stable != offsets.stable:
                self._forget(tp)
                stable, since = offsets.stable, now
            self._since[tp] = (stable, since)
            asked = self._asked.get(tp)
            if now - since >= self.stuck_after and (asked is None or now - asked >= self.recheck_after):
                due.append(tp)
        return sorted(due)

    def asked(self, partitions: Iterable[Partition], now: float) -> None:
        for tp in partitions:
            self._asked[tp] = now

    def _forget(self, tp: Partition) -> None:
        self._since.pop(tp, None)
        self._asked.pop(tp, None)


@dataclass(frozen=True)
class HangingTransaction:
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    start_offset: int


def parse_find_hanging(output: str) -> list[HangingTransaction]:
    """Rows of ``kafka-transactions find-hanging``'s table (tab-separated, one header line).

    Raises ValueError on a table it cannot read rather than guessing at columns.
    """
    lines = [line for line in output.splitlines() if line.strip()]
    header_at = next((i for i, line in enumerate(lines) if line.split()[:2] == ["Topic", "Partition"]), None)
    if header_at is None:
        raise ValueError(f"no find-hanging table in the tool's output: {output[-500:]!r}")
    columns = [c.strip() for c in lines[header_at].split("\t") if c.strip()]
    wanted = ("Topic", "Partition", "ProducerId", "ProducerEpoch", "StartOffset")
    if not set(wanted) <= set(columns):
        raise ValueError(f"find-hanging's table lacks {set(wanted) - set(columns)}: {lines[header_at]!r}")
    found = []
    for line in lines[header_at + 1 :]:
        cells = [c.strip() for c in line.split("\t") if c.strip()]
        if len(cells) != len(columns):
            raise ValueError(f"find-hanging row does not match its header {columns}: {line!r}")
        row = dict(zip(columns, cells, strict=True))
        found.append(
            HangingTransaction(
                topic=row["Topic"],
                partition=int(row["Partition"]),
                producer_id=int(row["ProducerId"]),
                producer_epoch=int(row["ProducerEpoch"]),
                start_offset=int(row["StartOffset"]),
            )
        )
    return found


Runner = Callable[[Sequence[str]], str]


def run_tool(args: Sequence[str]) -> str:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[-8:])} exited {proc.returncode}: {(proc.stderr or proc.stdout)[-800:]}")
    return proc.stdout


@dataclass(frozen=True)
class TransactionsTool:
    """Kafka's ``kafka-transactions`` (org.apache.kafka.tools.TransactionsCommand) on our classpath."""

    java: str
    kafka_libs: Path
    log4j_config: Path
    bootstrap: str
    run: Runner = run_tool

    def _command(self, *args: str) -> list[str]:
        return [
            self.java,
            "-Xmx128m",
            f"-Dlog4j2.configurationFile={self.log4j_config}",
            "-cp",
            f"{self.kafka_libs}/*",
            "org.apache.kafka.tools.TransactionsCommand",
            "--bootstrap-server",
            self.bootstrap,
            *args,
        ]

    def find_hanging(self, broker_id: int) -> list[HangingTransaction]:
        out = self.run(
            self._command(
                "find-hanging", "--broker-id", str(broker_id), "--max-transaction-timeout", str(MAX_TRANSACTION_MINUTES)
            )
        )
        return parse_find_hanging(out)

    def abort(self, txn: HangingTransaction) -> None:
        self.run(
            self._command(
                "abort",
                "--topic",
                txn.topic,
                "--partition",
                str(txn.partition),
                "--start-offset",
                str(txn.start_offset),
            )
        )


def read_offsets(admin: AdminClient, timeout: float = 10) -> tuple[dict[Partition, Offsets], dict[Partition, int]]:
    """Every partition's LSO and high watermark, and its leader's broker id."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]  # re-exported, not in __all__

    metadata = admin.list_topics(timeout=timeout)
    leaders = {
        (name, p.id): p.leader
        for name, topic in metadata.topics.items()
        if not topic.error
        for p in topic.partitions.values()
    }
    end = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    latest = {TopicPartition(t, p): end for t, p in leaders}

    def ends(level: IsolationLevel) -> dict[Partition, int]:
        futures = admin.list_offsets(latest, isolation_level=level, request_timeout=timeout)
        return {(tp.topic, tp.partition): fut.result().offset for tp, fut in futures.items()}

    stable = ends(IsolationLevel.READ_COMMITTED)
    high = ends(IsolationLevel.READ_UNCOMMITTED)
    return {tp: Offsets(stable[tp], high[tp]) for tp in stable if tp in high}, leaders


@dataclass
class Watchdog:
    """One tick: read offsets, ask about stuck partitions, abort what is hanging on them."""

    tool: TransactionsTool
    record: Path
    stuck: StuckPartitions = field(default_factory=StuckPartitions)

    def tick(
        self, snapshot: Mapping[Partition, Offsets], leaders: Mapping[Partition, int], now: float
    ) -> list[HangingTransaction]:
        due = self.stuck.observe(snapshot, now)
        if not due:
            return []
        log.warning("LSO stuck below the high watermark for %.0fs+ on %s", self.stuck.stuck_after, due)
        aborted = []
        for broker in sorted({leaders[tp] for tp in due if leaders.get(tp, -1) >= 0}):
            for txn in self.tool.find_hanging(broker):
                if (txn.topic, txn.partition) not in due:
                    continue  # hanging per the tool but not seen stuck by us yet: next tick decides
                self.tool.abort(txn)
                aborted.append(txn)
                self._note(txn, snapshot[(txn.topic, txn.partition)])
        self.stuck.asked(due, now)
        return aborted

    def _note(self, txn: HangingTransaction, offsets: Offsets) -> None:
        entry = {"at": time.time(), **asdict(txn), "stable": offsets.stable, "high": offsets.high}
        log.warning("aborted hanging transaction %s", json.dumps(entry))
        self.record.parent.mkdir(parents=True, exist_ok=True)
        with self.record.open("a") as f:
            f.write(json.dumps(entry) + "\n")


def read_record(record: Path, since: float = 0.0) -> list[dict[str, object]]:
    """The aborts the watchdog wrote to ``record`` at or after ``since`` (epoch seconds)."""
    if not record.exists():
        return []
    entries = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    return [e for e in entries if float(e["at"]) >= since]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--java", required=True)
    parser.add_argument("--kafka-libs", type=Path, required=True)
    parser.add_argument("--log4j-config", type=Path, required=True)
    parser.add_argument("--record", type=Path, required=True, help="JSON lines, one per aborted transaction")
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between offset reads")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    from confluent_kafka.admin import AdminClient

    # librdkafka's own lines (connection refused while Kafka restarts) would flood the log;
    # a failed tick says what went wrong once.
    admin = AdminClient({"bootstrap.servers": args.bootstrap, "log_level": 0})
    watchdog = Watchdog(TransactionsTool(args.java, args.kafka_libs, args.log4j_config, args.bootstrap), args.record)
    log.info("watching every partition's LSO every %.0fs", args.interval)
    while True:
        try:
            snapshot, leaders = read_offsets(admin)
            watchdog.tick(snapshot, leaders, time.monotonic())
        except Exception as exc:  # Kafka down or restarting: the next tick tries again
            log.info("tick skipped: %s", exc)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
