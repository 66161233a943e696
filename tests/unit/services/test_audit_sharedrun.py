"""SharedRun, the /verify walk shared between callers: concurrent callers share walks, a
caller never gets the answer of a walk that started before it asked, walks pause in
between, and callers beyond the bound are turned away."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from services.audit.sharedrun import Busy, SharedRun


class SlowCheck:
    """A check that reads the state when it starts (its snapshot) and takes ``seconds``."""

    def __init__(self, seconds: float = 0.2) -> None:
        self.seconds = seconds
        self.state = "ok"
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.started = threading.Event()
        self.fail: BaseException | None = None

    def __call__(self) -> str:
        snapshot = self.state
        self.starts.append(time.monotonic())
        self.started.set()
        time.sleep(self.seconds)
        self.ends.append(time.monotonic())
        if self.fail is not None:
            raise self.fail
        return snapshot


def in_threads(n: int, call: Callable[[], Any]) -> list[Any]:
    results: list[Any] = [None] * n

    def one(i: int) -> None:
        try:
            results[i] = call()
        except BaseException as exc:  # collected: the test looks at what each caller got
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    return results


def test_concurrent_callers_share_walks() -> None:
    check = SlowCheck(0.2)
    shared = SharedRun(check, max_callers=20, rest_ratio=0)
    assert in_threads(12, shared) == ["ok"] * 12
    assert len(check.starts) <= 2  # one under way when the rest arrived, and one they all shared


def test_a_caller_never_gets_a_walk_that_started_before_it_asked() -> None:
    check = SlowCheck(0.3)
    shared = SharedRun(check, rest_ratio=0)
    first: list[str] = []
    early = threading.Thread(target=lambda: first.append(shared()))
    early.start()
    assert check.started.wait(5)  # the first walk took its snapshot: the chain was intact
    check.state = "broken"  # ... and then it changed
    late = shared()  # asked after the change: must not get the running walk's "ok"
    early.join(5)
    assert first == ["ok"] and late == "broken"
    assert len(check.starts) == 2


def test_walks_rest_as_long_as_the_last_one_took() -> None:
    check = SlowCheck(0.15)
    shared = SharedRun(check, rest_ratio=1.0)
    assert shared() == "ok"
    assert shared() == "ok"  # one after the other: the second waits out the pause
    assert len(check.starts) == 2
    assert check.starts[1] - check.ends[0] >= 0.9 * (check.ends[0] - check.starts[0])


def test_callers_beyond_the_bound_are_turned_away() -> None:
    check = SlowCheck(0.3)
    shared = SharedRun(check, max_callers=3, rest_ratio=0)
    results = in_threads(8, shared)
    busy = [r for r in results if isinstance(r, Busy)]
    assert busy and len(busy) <= 5 and results.count("ok") >= 3
    assert shared() == "ok"  # and the bound is given back when they leave


def test_every_sharer_gets_the_walks_failure_and_the_next_caller_a_new_walk() -> None:
    check = SlowCheck(0.1)
    check.fail = RuntimeError("the chain head row is missing")
    shared = SharedRun(check, rest_ratio=0)
    results = in_threads(4, shared)
    assert all(isinstance(r, RuntimeError) for r in results)
    check.fail = None
    assert shared() == "ok"


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SharedRun(lambda: None, max_callers=0)
