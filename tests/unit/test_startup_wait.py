"""A starting service waits in-process for PostgreSQL and Kafka Connect, with back-off,
instead of crash-looping; it fails at once on an answer that retrying cannot change."""

from __future__ import annotations

import urllib.error
from typing import Any

import psycopg
import pytest

from flotilla import runner
from flotilla.connectors import ConnectError
from flotilla.runner import ServiceSpec, prepare_when_available
from flotilla.settings import ServiceSettings

pytestmark = pytest.mark.usefixtures("clean_env")  # tests/conftest.py

SPEC = ServiceSpec(name="policy-service", database="policy")


class Clock:
    """A fake clock the fake sleep advances."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _prepare_failing(monkeypatch: pytest.MonkeyPatch, failures: list[Exception]) -> list[int]:
    calls: list[int] = []

    def prepare(spec: ServiceSpec, settings: ServiceSettings) -> Any:
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return "ctx"

    monkeypatch.setattr(runner, "prepare", prepare)
    return calls


def _run(clock: Clock, patience: float = 300) -> Any:
    settings = ServiceSettings(startup_patience_seconds=patience)
    return prepare_when_available(SPEC, settings, sleep=clock.sleep, clock=lambda: clock.now)


def test_waits_out_a_restarting_postgres_and_an_unreachable_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    failures: list[Exception] = [
        psycopg.OperationalError("connection refused"),
        urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")),
        ConnectError("PUT /connectors/x/config -> 409: rebalance in progress", 409),
        ConnectError("PUT /connectors/x/config -> 500: timed out", 500),
        psycopg.OperationalError("the database system is starting up"),
        psycopg.OperationalError("still starting"),
    ]
    clock = Clock()
    calls = _prepare_failing(monkeypatch, failures)
    assert _run(clock) == "ctx"
    assert len(calls) == 7
    assert clock.slept == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]  # doubling, capped at 10 s


@pytest.mark.parametrize(
    "error",
    [
        ConnectError("PUT /connectors/x/config -> 400: invalid slot.name", 400),
        ConnectError("connector x failed: replication slot is in use"),
        psycopg.errors.UndefinedTable("relation missing"),  # a migration bug, not an outage
        ValueError("a bug"),
    ],
)
def test_an_answer_retrying_cannot_change_fails_at_once(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    clock = Clock()
    calls = _prepare_failing(monkeypatch, [error])
    with pytest.raises(type(error)):
        _run(clock)
    assert len(calls) == 1 and clock.slept == []


def test_gives_up_when_the_patience_runs_out(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    calls = _prepare_failing(monkeypatch, [psycopg.OperationalError("down")] * 100)
    with pytest.raises(psycopg.OperationalError):
        _run(clock, patience=30)
    assert sum(clock.slept) <= 30
    assert clock.slept == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]  # the next 10 s wait would pass 30 s
    assert len(calls) == 7


def test_no_patience_means_no_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    _prepare_failing(monkeypatch, [psycopg.OperationalError("down")])
    with pytest.raises(psycopg.OperationalError):
        _run(clock, patience=0)
    assert clock.slept == []
