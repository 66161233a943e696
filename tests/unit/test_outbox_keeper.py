"""The connector keeper's back-off: a task that fails again at the same position (the same
row) is not restarted every tick for ever, and is reported while it is held up
(security review 3, H2). Connect's answers are scripted; the real connector's are in
tests/integration/test_outbox_set_aside.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from flotilla import connectors, runner
from flotilla.connectors import RESTART_BACKOFF_MAX_SECONDS, RESTART_BACKOFF_SECONDS, Keeper
from flotilla.runner import ServiceContext

TOO_LARGE = (
    "org.apache.kafka.connect.errors.ConnectException: Unrecoverable exception from producer send callback\n"
    "Caused by: org.apache.kafka.common.errors.RecordTooLargeException: The message is 1100904 bytes"
)


class FakeConnect:
    """Connect's status and offsets, as the test sets them; restarts recorded."""

    def __init__(self) -> None:
        self.state = "RUNNING"
        self.lsn: int | None = 100
        self.restarts = 0

    def __call__(self, url: str, method: str = "GET", body: object | None = None) -> object:
        if method == "POST":
            self.restarts += 1
            return None
        if url.endswith("/offsets"):
            offsets = [] if self.lsn is None else [{"partition": {"server": "x"}, "offset": {"lsn": self.lsn}}]
            return {"offsets": offsets}
        task: dict[str, Any] = {"id": 0, "state": self.state}
        if self.state == "FAILED":
            task["trace"] = TOO_LARGE
        return {"connector": {"state": "RUNNING"}, "tasks": [task]}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def connect(monkeypatch: pytest.MonkeyPatch) -> FakeConnect:
    fake = FakeConnect()
    monkeypatch.setattr(connectors, "_request", fake)
    return fake


def test_a_running_connector_is_left_alone(connect: FakeConnect) -> None:
    keeper = Keeper("http://connect", "outbox-x", clock=Clock())
    assert keeper.check() is False
    assert connect.restarts == 0 and keeper.failures == 0 and keeper.stuck is None


def test_the_first_failure_at_a_position_is_restarted_at_once(connect: FakeConnect) -> None:
    keeper = Keeper("http://connect", "outbox-x", clock=Clock())
    connect.state = "FAILED"
    assert keeper.check() is True
    assert (connect.restarts, keeper.failures, keeper.position) == (1, 1, "lsn 100")
    assert keeper.stuck is None  # one failure is a restart's business, not a report


def test_failing_again_at_the_same_position_backs_off_doubling_and_is_reported(connect: FakeConnect) -> None:
    clock = Clock()
    keeper = Keeper("http://connect", "outbox-x", clock=clock)
    connect.state = "FAILED"
    keeper.check()  # failure 1: restarted
    waits = []
    for failures in range(2, 9):
        assert keeper.check() is False  # failed again (the restart did not help): counted, not restarted
        assert keeper.failures == failures
        started = clock.now
        while not keeper.check():  # ticks until the back-off is over
            clock.now += 1
        waits.append(clock.now - started)
    assert waits == [min(RESTART_BACKOFF_SECONDS * 2**n, RESTART_BACKOFF_MAX_SECONDS) for n in range(7)]
    assert connect.restarts == 1 + 7
    stuck = keeper.stuck
    assert stuck is not None
    assert "outbox-x failed 8 times at lsn 100" in stuck and "RecordTooLargeException" in stuck


def test_a_failure_at_a_new_position_starts_over(connect: FakeConnect) -> None:
    clock = Clock()
    keeper = Keeper("http://connect", "outbox-x", clock=clock)
    connect.state = "FAILED"
    keeper.check()
    keeper.check()
    assert keeper.failures == 2
    clock.now += RESTART_BACKOFF_SECONDS
    assert keeper.check() is True
    connect.lsn = 250  # the restart published rows, then another row failed
    assert keeper.check() is True  # a new position: restarted at once
    assert keeper.failures == 1 and keeper.position == "lsn 250" and keeper.stuck is None


def test_running_again_clears_the_report(connect: FakeConnect) -> None:
    keeper = Keeper("http://connect", "outbox-x", clock=Clock())
    connect.state = "FAILED"
    keeper.check()
    keeper.check()
    assert keeper.stuck is not None
    connect.state = "RUNNING"
    keeper.check()
    assert (keeper.failures, keeper.position, keeper.stuck) == (0, None, None)


def test_no_committed_position_still_counts_the_failures(connect: FakeConnect) -> None:
    connect.lsn = None  # a connector that never committed (failed during its snapshot)
    keeper = Keeper("http://connect", "outbox-x", clock=Clock())
    connect.state = "FAILED"
    keeper.check()
    keeper.check()
    assert keeper.failures == 2
    assert keeper.stuck is not None and "an unknown position" in keeper.stuck


def test_readiness_says_why_the_service_cannot_publish(connect: FakeConnect) -> None:
    spec = SimpleNamespace(name="svc", database="flotilla_keeper_ready", publishes=True)
    ctx = cast(ServiceContext, SimpleNamespace(spec=spec, settings=SimpleNamespace(connect_url="http://connect")))
    assert runner.connector_not_ready(ctx) is None
    connect.state = "FAILED"
    runner.keep_outbox_connector(ctx)
    runner.keep_outbox_connector(ctx)
    reason = runner.connector_not_ready(ctx)
    assert reason is not None and "outbox-flotilla-keeper-ready" in reason
    silent = cast(ServiceContext, SimpleNamespace(spec=SimpleNamespace(publishes=False)))
    assert runner.connector_not_ready(silent) is None


def test_the_committed_position_reads_debeziums_lsn_else_the_whole_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[object] = [
        {"offsets": [{"partition": {"server": "x"}, "offset": {"lsn": 7, "txId": 3}}]},
        {"offsets": [{"partition": {"server": "x"}, "offset": {"snapshot": True}}]},
        {"offsets": []},
    ]
    monkeypatch.setattr(connectors, "_request", lambda url, method="GET", body=None: answers.pop(0))
    assert connectors.committed_position("http://connect", "x") == "lsn 7"
    assert connectors.committed_position("http://connect", "x") == '[{"snapshot": true}]'
    assert connectors.committed_position("http://connect", "x") is None

    def refused(url: str, method: str = "GET", body: object | None = None) -> object:
        raise connectors.ConnectError("GET -> 404", 404)

    monkeypatch.setattr(connectors, "_request", refused)
    assert connectors.committed_position("http://connect", "x") is None
