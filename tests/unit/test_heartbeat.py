"""flotilla.heartbeat: beats while the block runs, stops with it, survives a failing renew,
and stops for good once the lease is reported lost."""

from __future__ import annotations

import threading
import time

import pytest

from flotilla import Heartbeat


def test_beats_at_its_period_while_the_block_runs_and_not_after() -> None:
    beats: list[float] = []
    started = time.monotonic()
    with Heartbeat(lambda: beats.append(time.monotonic() - started) or True, 0.05, "test") as beat:
        time.sleep(0.33)
    ended = len(beats)
    time.sleep(0.15)
    assert 4 <= ended <= 7, beats
    assert len(beats) == ended  # nothing after the block
    assert beats[0] >= 0.05  # the first beat is one period in, not at once
    assert beat.beats == ended and not beat.lost.is_set()


def test_a_renew_that_raises_is_tried_again_at_the_next_beat() -> None:
    calls = {"n": 0}

    def flaky() -> bool:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise ConnectionError("the database is restarting")
        return True

    with Heartbeat(flaky, 0.03, "test") as beat:
        time.sleep(0.25)
    assert calls["n"] >= 4
    assert beat.beats == calls["n"] - 2
    assert not beat.lost.is_set()


def test_a_lost_lease_stops_the_beats_and_says_so() -> None:
    calls = {"n": 0}

    def taken_over() -> bool:
        calls["n"] += 1
        return calls["n"] < 2

    with Heartbeat(taken_over, 0.03, "test") as beat:
        assert beat.lost.wait(2)
        time.sleep(0.15)
    assert calls["n"] == 2 and beat.beats == 1


def test_an_exception_in_the_block_still_stops_the_beats() -> None:
    beating = threading.Event()
    with pytest.raises(RuntimeError), Heartbeat(lambda: beating.set() or True, 0.02, "test"):
        assert beating.wait(2)
        raise RuntimeError("the model failed")
    assert not any(t.name == "heartbeat test" for t in threading.enumerate())


def test_a_period_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Heartbeat(lambda: True, 0, "test")
