"""The transaction watchdog against the real broker and Kafka's real tool.

The unsafe mistake would be aborting a transaction that is merely long: a producer that
holds one open past find-hanging's one-minute floor must see nothing aborted and still
commit. (A truly hanging transaction needs a broker killed between PrepareCommit and its
markers, which no test can time; the soak meets it, and the unit tests cover what the
watchdog does with the tool's answer.) Also: the stack runs the watchdog.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from flotilla.settings import StackSettings, kafka_connection
from tests.support.scripts import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCAL = REPO_ROOT / "infra" / "local"

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def stackctl(stack: StackSettings) -> ModuleType:
    if stack.stack != "local":
        pytest.skip("the watchdog runs with the local stack")
    return load_script("_stackctl_for_watchdog", LOCAL / "stackctl.py")


@pytest.fixture(scope="module")
def wd() -> ModuleType:
    return load_script("_txn_watchdog_live", LOCAL / "txn_watchdog.py")


@pytest.fixture()
def scratch_topic(stack: StackSettings) -> Iterator[str]:
    admin = AdminClient(kafka_connection(stack.kafka_bootstrap))
    name = f"scratch-txn-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])[name].result(timeout=30)
    yield name
    admin.delete_topics([name])[name].result(timeout=30)


def test_the_stack_supervises_the_watchdog(stackctl: ModuleType) -> None:
    out = subprocess.run(
        [sys.executable, str(LOCAL / "stackctl.py"), "pid", stackctl.TXN_WATCHDOG], capture_output=True, text=True
    )
    assert out.stdout.strip().isdigit(), out.stdout + out.stderr


def test_a_long_live_transaction_is_left_alone_and_still_commits(
    stack: StackSettings, stackctl: ModuleType, wd: ModuleType, scratch_topic: str, tmp_path: Path
) -> None:
    java, _ = stackctl._java(17, "Kafka's tools")
    tool = wd.TransactionsTool(
        java, stackctl.DIST / "kafka" / "libs", LOCAL / "log4j2-tools.properties", stack.kafka_bootstrap
    )
    dog = wd.Watchdog(tool, tmp_path / "aborted.jsonl", wd.StuckPartitions(stuck_after=0))
    admin = AdminClient(kafka_connection(stack.kafka_bootstrap))
    producer = Producer(
        {
            **kafka_connection(stack.kafka_bootstrap),
            "transactional.id": f"watchdog-test-{uuid.uuid4().hex[:8]}",
            "transaction.timeout.ms": 300_000,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(scratch_topic, key=b"k", value=b"held open")
    assert producer.flush(30) == 0
    tp = (scratch_topic, 0)

    time.sleep(65)  # past find-hanging's floor: a transaction open over a minute
    snapshot, leaders = wd.read_offsets(admin)
    assert snapshot[tp].open_transaction, snapshot[tp]
    aborted = dog.tick({tp: snapshot[tp]}, leaders, time.monotonic())  # the JVM tool runs for real
    assert aborted == []
    assert dog.stuck.observe({tp: snapshot[tp]}, time.monotonic()) == []  # asked: not again this period

    producer.commit_transaction(30)
    # the coordinator writes the commit marker after it answers the commit: wait for it
    deadline = time.monotonic() + 15
    while (snapshot := wd.read_offsets(admin)[0])[tp].open_transaction and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not snapshot[tp].open_transaction, snapshot[tp]
    assert snapshot[tp].high == 2  # the record and its commit marker: nothing was aborted under it
