"""Concurrent reads of one query asked as one request (flotilla_evidence.coalesce)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from flotilla_evidence.coalesce import Coalescer


class Asked:
    """An ``ask`` that records each union it was called with; the first call can be held."""

    def __init__(self, hold_first: bool = False, fail: bool = False) -> None:
        self.unions: list[frozenset[str]] = []
        self.release = threading.Event()
        self.started = threading.Event()
        self.hold_first = hold_first
        self.fail = fail

    def __call__(self, union: frozenset[str]) -> list[str]:
        self.unions.append(union)
        self.started.set()
        if self.hold_first and len(self.unions) == 1:
            assert self.release.wait(5)
        if self.fail:
            raise RuntimeError(f"no answer for {sorted(union)}")
        return sorted(union)


def in_thread(target: Callable[[], object], results: list[object]) -> threading.Thread:
    def run() -> None:
        try:
            results.append(target())
        except Exception as exc:  # the test reads what each reader got
            results.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_lone_read_is_asked_at_once_with_its_own_scope() -> None:
    coalescer: Coalescer[str, str] = Coalescer()
    ask = Asked()
    assert coalescer.read("p95", frozenset({"a"}), ask) == ["a"]
    assert coalescer.read("p95", frozenset({"b"}), ask) == ["b"]
    assert ask.unions == [frozenset({"a"}), frozenset({"b"})]
    assert (coalescer.requests, coalescer.reads) == (2, 2)


def test_reads_that_arrive_while_one_is_asked_are_asked_together_next() -> None:
    coalescer: Coalescer[str, str] = Coalescer()
    ask = Asked(hold_first=True)
    results: list[object] = []
    first = in_thread(lambda: coalescer.read("p95", frozenset({"a"}), ask), results)
    assert ask.started.wait(5)
    later = [in_thread(lambda n=n: coalescer.read("p95", frozenset({n, "shared"}), ask), results) for n in "bcd"]
    wait_for(lambda: coalescer.reads == 4)
    ask.release.set()
    for thread in (first, *later):
        thread.join(5)
    assert ask.unions == [frozenset({"a"}), frozenset({"b", "c", "d", "shared"})]
    assert sorted(map(str, results)) == sorted(map(str, [["a"], *[["b", "c", "d", "shared"]] * 3]))
    assert (coalescer.requests, coalescer.reads) == (2, 4)


def test_reads_of_other_queries_neither_merge_nor_wait() -> None:
    coalescer: Coalescer[str, str] = Coalescer()
    held = Asked(hold_first=True)
    results: list[object] = []
    first = in_thread(lambda: coalescer.read("p95", frozenset({"a"}), held), results)
    assert held.started.wait(5)
    assert coalescer.read("edges", frozenset({"a"}), Asked()) == ["a"]  # not behind the held p95
    held.release.set()
    first.join(5)
    assert results == [["a"]]


def test_a_failed_request_fails_every_read_of_its_batch_and_the_next_batch_asks_again() -> None:
    coalescer: Coalescer[str, str] = Coalescer()
    failing = Asked(hold_first=True, fail=True)
    results: list[object] = []
    first = in_thread(lambda: coalescer.read("p95", frozenset({"a"}), failing), results)
    assert failing.started.wait(5)
    later = [in_thread(lambda n=n: coalescer.read("p95", frozenset({n}), failing), results) for n in "bc"]
    wait_for(lambda: coalescer.reads == 3)
    failing.release.set()
    for thread in (first, *later):
        thread.join(5)
    assert len(results) == 3 and all(isinstance(r, RuntimeError) for r in results)
    assert coalescer.read("p95", frozenset({"z"}), Asked()) == ["z"]


@pytest.mark.parametrize("readers", [2, 16])
def test_every_read_gets_an_answer_that_covers_its_scope(readers: int) -> None:
    coalescer: Coalescer[str, str] = Coalescer()

    def slow(union: frozenset[str]) -> list[str]:
        time.sleep(0.01)
        return sorted(union)

    results: list[object] = []
    threads = [
        in_thread(lambda n=n: (n, coalescer.read("p95", frozenset({f"s{n}"}), slow)), results) for n in range(readers)
    ]
    for thread in threads:
        thread.join(5)
    assert len(results) == readers
    for n, answer in results:  # type: ignore[misc]
        assert f"s{n}" in answer


def test_what_cannot_be_asked_is_left_out_and_a_read_of_nothing_else_fails_alone() -> None:
    """One bad scope element (a name no request can carry) used to fail the merged request
    and every reader of it; now it never joins."""

    def askable(scope: frozenset[str]) -> frozenset[str]:
        kept = frozenset(n for n in scope if not n.startswith("bad"))
        if not kept:
            raise LookupError(f"nothing askable in {sorted(scope)}")
        return kept

    coalescer: Coalescer[str, str] = Coalescer(askable)
    ask = Asked(hold_first=True)
    results: list[object] = []
    first = in_thread(lambda: coalescer.read("p95", frozenset({"a"}), ask), results)
    assert ask.started.wait(5)
    later = [
        in_thread(lambda s=s: coalescer.read("p95", frozenset(s), ask), results)
        for s in ({"b", "bad-1"}, {"bad-2"}, {"c"})
    ]
    wait_for(lambda: len(results) == 1)  # the read of nothing askable failed at once, alone
    assert isinstance(results[0], LookupError) and "bad-2" in str(results[0])
    wait_for(lambda: coalescer.reads == 3)
    ask.release.set()
    for thread in (first, *later):
        thread.join(5)
    assert ask.unions == [frozenset({"a"}), frozenset({"b", "c"})]
    assert sorted(map(str, results[1:])) == sorted(map(str, [["a"], ["b", "c"], ["b", "c"]]))
