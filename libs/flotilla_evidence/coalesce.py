"""Concurrent reads of one query, asked as one request: a storm's diagnoses share Prometheus.

In a storm every diagnosis and plan reads its own neighbourhood with the same handful of
queries, each scoped to a few services. While a query of one kind is being asked, the
reads of that kind that arrive wait and are then asked together, as one request for the
union of their scopes; each reader keeps the series of its own scope (the caller filters).
A lone reader waits for nobody, so an idle agent asks exactly as before; under load
Prometheus evaluates one query per kind per round instead of one per incident (group
commit, applied to reads).

What one reader adds to a request is screened first (``askable``): a scope element no
request can carry (a name from telemetry that cannot be a label value) would fail the
request, and with it every reader that joined it. It is left out; a reader with nothing
left fails alone, before joining.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")  # what a request answers with (a list of it)
S = TypeVar("S", bound=Hashable)  # one element of a read's scope (a name)


@dataclass
class _Batch(Generic[S, T]):
    scopes: set[S] = field(default_factory=set)
    done: threading.Event = field(default_factory=threading.Event)
    answer: list[T] | None = None
    error: BaseException | None = None


class Coalescer(Generic[S, T]):
    """Merges concurrent :meth:`read` calls of the same key; thread-safe."""

    def __init__(self, askable: Callable[[frozenset[S]], frozenset[S]] | None = None) -> None:
        # the part of a read's scope that may join a request; raises for that reader alone
        self._askable = askable
        self._lock = threading.Lock()
        self._open: dict[Hashable, _Batch[S, T]] = {}  # the batch a new read of a key joins
        self._asking: dict[Hashable, threading.Lock] = {}  # held while a key's batch is asked
        self.requests = 0  # requests made (for tests and figures)
        self.reads = 0  # reads answered

    def read(self, key: Hashable, scope: frozenset[S], ask: Callable[[frozenset[S]], list[T]]) -> list[T]:
        """The answer to ``ask(union of the batch's scopes)``: the batch this read joins, or
        a new one it asks once the key's previous request has returned (``ask`` of the read
        that opened the batch is the one called). Raises what that call raised, or what
        ``askable`` raised for this read's scope (then for this read only)."""
        if self._askable is not None:
            scope = self._askable(scope)
        with self._lock:
            self.reads += 1
            batch = self._open.get(key)
            opened = batch is None
            if batch is None:
                batch = self._open[key] = _Batch()
            batch.scopes |= scope
            asking = self._asking.setdefault(key, threading.Lock())
        if not opened:
            batch.done.wait()
        else:
            with asking:  # while the previous batch is asked, this one gathers readers
                with self._lock:
                    del self._open[key]
                    union = frozenset(batch.scopes)
                    self.requests += 1
                try:
                    batch.answer = ask(union)
                except BaseException as exc:  # every reader of the batch gets it
                    batch.error = exc
                finally:
                    batch.done.set()
        if batch.error is not None:
            raise batch.error
        assert batch.answer is not None
        return batch.answer
