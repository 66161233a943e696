"""How deferred-work threads are paced without polling: the bell that wakes them, and the
runner's loop that waits on a pace instead of an interval (no database here; the NOTIFY
path is tests/integration/services/test_agents.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

from flotilla.deferred import Bell
from flotilla.runner import _run_periodic


def test_a_ring_wakes_a_waiting_thread() -> None:
    bell = Bell()
    seen = bell.rings
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(bell.wait_past(seen, 10)))
    waiter.start()
    time.sleep(0.1)
    started = time.monotonic()
    bell.ring()
    waiter.join(5)
    assert woke == [True]
    assert time.monotonic() - started < 1


def test_a_ring_before_the_wait_is_not_lost() -> None:
    # The thread looked for work (and found none), then the work was notified, then it waits.
    bell = Bell()
    seen = bell.rings
    bell.ring()
    started = time.monotonic()
    assert bell.wait_past(seen, 10) is True
    assert time.monotonic() - started < 0.1


def test_without_a_ring_the_wait_ends_at_its_timeout() -> None:
    bell = Bell()
    started = time.monotonic()
    assert bell.wait_past(bell.rings, 0.3) is False
    assert 0.25 < time.monotonic() - started < 2


def test_a_stopping_service_is_not_kept_waiting() -> None:
    bell = Bell()
    stopping = threading.Event()
    threading.Timer(0.2, stopping.set).start()
    started = time.monotonic()
    assert bell.wait_past(bell.rings, 30, stopping) is False
    assert time.monotonic() - started < 1.5


class _Ctx:
    def __init__(self) -> None:
        self.stopping = threading.Event()


class _CountingPace:
    """Lets the task run three times, then stops the service."""

    def __init__(self) -> None:
        self.waits = 0

    def wait(self, ctx: Any) -> None:
        self.waits += 1
        if self.waits > 3:
            ctx.stopping.set()


def test_the_runner_runs_a_paced_task_each_time_its_pace_returns() -> None:
    ctx = _Ctx()
    pace = _CountingPace()
    runs: list[int] = []

    def task(_: Any) -> None:
        runs.append(1)
        if len(runs) == 2:
            raise RuntimeError("a failing run is logged, and the task runs again")

    _run_periodic(ctx, pace, task)  # type: ignore[arg-type]
    assert len(runs) == 3
    assert pace.waits == 4


def test_the_runner_still_runs_a_task_on_a_fixed_interval() -> None:
    ctx = _Ctx()
    runs: list[float] = []

    def task(_: Any) -> None:
        runs.append(time.monotonic())
        if len(runs) == 3:
            ctx.stopping.set()

    started = time.monotonic()
    _run_periodic(ctx, 0.1, task)  # type: ignore[arg-type]
    assert len(runs) == 3
    assert runs[0] - started >= 0.09  # waits first, then runs
