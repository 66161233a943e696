"""Offline stand-ins for the CLI's unit tests: a registry holding the real contracts, a
producer that records what it was asked to send, a consumer fed with messages, and
services answering through httpx.MockTransport."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support.messages import FakeMessage


@dataclass
class Produced:
    topic: str
    key: str | None
    value: bytes
    headers: dict[str, str]


@dataclass
class FakeProducer:
    """Records produce() calls; acknowledges each on poll/flush unless told otherwise."""

    fail_with: str | None = None  # every delivery reports this error
    never_ack: bool = False  # flush() leaves everything undelivered (Kafka unreachable)
    produced: list[Produced] = field(default_factory=list)
    _pending: list[tuple[Callable[[Any, Any], None], int]] = field(default_factory=list)

    def produce(self, topic: str, **kwargs: Any) -> None:
        headers = {k: v.decode() for k, v in kwargs.get("headers") or []}
        self.produced.append(Produced(topic, kwargs.get("key"), kwargs["value"], headers))
        self._pending.append((kwargs["on_delivery"], len(self.produced) - 1))

    def _deliver(self) -> None:
        if self.never_ack:
            return
        for callback, index in self._pending:
            if self.fail_with:
                callback(self.fail_with, None)
            else:
                callback(
                    None, FakeMessage(topic=self.produced[index].topic, headers=[], partition=index % 3, offset=index)
                )
        self._pending.clear()

    def poll(self, timeout: float = 0) -> int:
        self._deliver()
        return 0

    def flush(self, timeout: float = 0) -> int:
        self._deliver()
        return len(self._pending)


class FakeConsumer:
    def __init__(self, messages: Sequence[FakeMessage]) -> None:
        self._messages = list(messages)
        self.closed = False
        self.opened_with: dict[str, Any] = {}

    def poll(self, timeout: float = 0) -> FakeMessage | None:
        return self._messages.pop(0) if self._messages else None

    def close(self) -> None:
        self.closed = True


class Services:
    """Answers the fleet's HTTP calls from a table of (method, path) → (status, body);
    remembers every request."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], tuple[int, Any]] = {}
        self.requests: list[httpx.Request] = []
        self.down = False

    def on(self, method: str, path: str, status: int, body: Any) -> None:
        self.routes[(method, path)] = (status, body)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        found = self.routes.get((request.method, request.url.path))
        if found is None:
            return httpx.Response(404, json={"detail": f"no route {request.method} {request.url.path}"})
        return httpx.Response(found[0], json=found[1])

    def posted(self, path: str) -> list[dict[str, Any]]:
        return [json.loads(r.content or b"{}") for r in self.requests if r.method == "POST" and r.url.path == path]


def json_lines(text: str) -> Iterator[dict[str, Any]]:
    for line in text.splitlines():
        if line.strip():
            yield json.loads(line)
