"""The transaction watchdog's decisions (infra/local/txn_watchdog.py), without a broker.

What must hold: a partition is only suspected after its LSO sat still below the high
watermark for the whole window; Kafka's tool is asked once per recheck period, not every
tick; only a transaction the tool calls hanging *and* on a partition seen stuck is
aborted; a table the tool prints that we cannot read is an error, never an empty list.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.scripts import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wd() -> ModuleType:
    return load_script("_txn_watchdog_under_test", REPO_ROOT / "infra" / "local" / "txn_watchdog.py")


# What `kafka-transactions find-hanging` printed on the wedged soak stack (Kafka 4.3.0).
COLUMNS = ["Topic           ", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset"]
HEADER = "\t".join([*COLUMNS, "LastTimestamp", "Duration(min)", "\n"])
WEDGED = (
    HEADER
    + "incidents       \t2        \t5         \t1885         \t10              \t4877       \t1796484375975\t165\t\n"
    + "_connect-offsets\t0        \t5         \t1885         \t10              \t16936      \t1796484375976\t165\t\n"
)
NONE_HANGING = "\t".join(h.strip() for h in HEADER.split("\t")[:-1]) + "\t\n"


def test_parses_the_tools_table(wd: ModuleType) -> None:
    rows = wd.parse_find_hanging(WEDGED)
    assert rows == [
        wd.HangingTransaction("incidents", 2, 5, 1885, 4877),
        wd.HangingTransaction("_connect-offsets", 0, 5, 1885, 16936),
    ]
    assert wd.parse_find_hanging(NONE_HANGING) == []


@pytest.mark.parametrize(
    "output",
    [
        "",  # the tool printed nothing
        "Error: Could not find or load main class org.apache.kafka.tools.TransactionsCommand\n",
        "Topic\tPartition\tProducerId\n",  # columns we need are missing
        NONE_HANGING + "incidents\t2\t5\n",  # a row shorter than its header
        NONE_HANGING + "incidents\ttwo\t5\t1\t1\t10\t0\t1\t\n",  # not a number
    ],
)
def test_an_unreadable_table_is_an_error_not_nothing_hanging(wd: ModuleType, output: str) -> None:
    with pytest.raises(ValueError):
        wd.parse_find_hanging(output)


def test_a_partition_is_due_only_after_its_lso_sat_still_for_the_window(wd: ModuleType) -> None:
    stuck = wd.StuckPartitions(stuck_after=90, recheck_after=300)
    tp = ("incidents", 2)
    assert stuck.observe({tp: wd.Offsets(10, 12)}, now=0) == []
    assert stuck.observe({tp: wd.Offsets(10, 15)}, now=89) == []  # more written behind it: still the same LSO
    assert stuck.observe({tp: wd.Offsets(10, 15)}, now=90) == [tp]


def test_a_moving_lso_or_a_closed_transaction_starts_the_window_over(wd: ModuleType) -> None:
    stuck = wd.StuckPartitions(stuck_after=90)
    tp = ("commands", 0)
    stuck.observe({tp: wd.Offsets(10, 12)}, now=0)
    assert stuck.observe({tp: wd.Offsets(11, 13)}, now=60) == []  # moved: a live transaction
    assert stuck.observe({tp: wd.Offsets(11, 13)}, now=140) == []  # 80 s since it moved
    assert stuck.observe({tp: wd.Offsets(11, 13)}, now=150) == [tp]
    assert stuck.observe({tp: wd.Offsets(13, 13)}, now=151) == []  # closed
    assert stuck.observe({tp: wd.Offsets(13, 14)}, now=200) == []  # a new one: from scratch


def test_the_tool_is_asked_again_only_after_the_recheck_period(wd: ModuleType) -> None:
    stuck = wd.StuckPartitions(stuck_after=90, recheck_after=300)
    tp = ("incidents", 0)
    stuck.observe({tp: wd.Offsets(1, 2)}, now=0)
    assert stuck.observe({tp: wd.Offsets(1, 2)}, now=100) == [tp]
    stuck.asked([tp], now=100)
    assert stuck.observe({tp: wd.Offsets(1, 2)}, now=200) == []
    assert stuck.observe({tp: wd.Offsets(1, 2)}, now=400) == [tp]


def test_a_partition_that_disappears_is_forgotten(wd: ModuleType) -> None:
    stuck = wd.StuckPartitions(stuck_after=90)
    tp = ("scratch", 0)
    stuck.observe({tp: wd.Offsets(1, 2)}, now=0)
    stuck.observe({}, now=50)  # topic deleted
    assert stuck.observe({tp: wd.Offsets(1, 2)}, now=100) == []  # a new window, not 100 s old


class FakeKafkaTools:
    """Stands in for the JVM: answers find-hanging with ``table``; records every command."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.commands: list[list[str]] = []

    def __call__(self, args: Sequence[str]) -> str:
        self.commands.append(list(args))
        return self.table if "find-hanging" in args else ""

    def subcommands(self) -> list[list[str]]:
        return [c[c.index("--bootstrap-server") + 2 :] for c in self.commands]


def watchdog(wd: ModuleType, tools: FakeKafkaTools, record: Path) -> ModuleType:
    tool = wd.TransactionsTool("java", Path("/libs"), Path("/log4j2.properties"), "127.0.0.1:19092", run=tools)
    return wd.Watchdog(tool, record, wd.StuckPartitions(stuck_after=90))


def test_aborts_only_hanging_transactions_on_partitions_it_saw_stuck(wd: ModuleType, tmp_path: Path) -> None:
    tools = FakeKafkaTools(WEDGED)
    dog = watchdog(wd, tools, tmp_path / "aborted.jsonl")
    # _connect-offsets-0 is stuck; incidents-2 has just had its LSO move, so it waits a window
    snapshot = {("_connect-offsets", 0): wd.Offsets(16936, 16937), ("incidents", 2): wd.Offsets(4877, 4878)}
    leaders = {tp: 1 for tp in snapshot}
    dog.tick({("_connect-offsets", 0): wd.Offsets(16936, 16937), ("incidents", 2): wd.Offsets(4870, 4878)}, leaders, 0)
    assert dog.tick(snapshot, leaders, 5) == []  # nobody stuck for 90 s yet: the JVM is not run
    assert tools.commands == []

    aborted = dog.tick(snapshot, leaders, 91)
    assert aborted == [wd.HangingTransaction("_connect-offsets", 0, 5, 1885, 16936)]
    assert tools.subcommands() == [
        ["find-hanging", "--broker-id", "1", "--max-transaction-timeout", "1"],
        ["abort", "--topic", "_connect-offsets", "--partition", "0", "--start-offset", "16936"],
    ]
    (entry,) = wd.read_record(tmp_path / "aborted.jsonl")
    assert entry["topic"] == "_connect-offsets" and entry["start_offset"] == 16936 and entry["high"] == 16937
    assert wd.read_record(tmp_path / "aborted.jsonl", since=float(entry["at"]) + 1) == []

    aborted = dog.tick(snapshot, leaders, 100)  # incidents-2 stuck for 90 s now
    assert [t.topic for t in aborted] == ["incidents"]


def test_nothing_hanging_means_nothing_aborted_and_no_rerun_every_tick(wd: ModuleType, tmp_path: Path) -> None:
    tools = FakeKafkaTools(NONE_HANGING)  # a long but live transaction: the coordinator still tracks it
    dog = watchdog(wd, tools, tmp_path / "aborted.jsonl")
    snapshot, leaders = {("commands", 1): wd.Offsets(7, 9)}, {("commands", 1): 1}
    for now in (0, 91, 106, 121):
        assert dog.tick(snapshot, leaders, now) == []
    assert [c[0] for c in tools.subcommands()] == ["find-hanging"]
    assert not (tmp_path / "aborted.jsonl").exists()


def test_a_failing_tool_raises_so_the_tick_is_retried(wd: ModuleType, tmp_path: Path) -> None:
    def broken(args: Sequence[str]) -> str:
        raise RuntimeError("TransactionsCommand exited 1: broker unreachable")

    tool = wd.TransactionsTool("java", Path("/libs"), Path("/l.properties"), "127.0.0.1:1", run=broken)
    dog = wd.Watchdog(tool, tmp_path / "r.jsonl", wd.StuckPartitions(stuck_after=0))
    with pytest.raises(RuntimeError):
        dog.tick({("incidents", 0): wd.Offsets(1, 2)}, {("incidents", 0): 1}, 0)
    assert dog.stuck.observe({("incidents", 0): wd.Offsets(1, 2)}, 1) == [("incidents", 0)]  # still due


def test_record_lines_are_json(wd: ModuleType, tmp_path: Path) -> None:
    record = tmp_path / "r.jsonl"
    record.write_text(json.dumps({"at": 5.0, "topic": "t"}) + "\n\n" + json.dumps({"at": 9.0, "topic": "u"}) + "\n")
    assert [e["topic"] for e in wd.read_record(record, since=6)] == ["u"]
    assert wd.read_record(tmp_path / "absent.jsonl") == []
