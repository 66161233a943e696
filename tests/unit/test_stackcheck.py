"""flotilla.stackcheck: which components of a named stack do not answer.

PostgreSQL and Kafka are stood in for (a fake connection, a fake admin client); the HTTP
components are a local server that answers per path, so the probes are real requests.
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from flotilla import stackcheck
from flotilla.settings import StackSettings


class _Answers(http.server.BaseHTTPRequestHandler):
    """200 on every path, except those given another status in ``status``."""

    status: dict[str, int] = {}  # noqa: RUF012 - set per test on a subclass
    seen: list[str] = []  # noqa: RUF012

    def do_GET(self) -> None:
        self.seen.append(self.path)
        self.send_response(self.status.get(self.path, 200))
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Answers]]]:
    handler: type[_Answers] = type("Handler", (_Answers,), {"status": {}, "seen": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


class _Connection:
    def __enter__(self) -> _Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute(self, sql: str) -> None:
        pass


class _Admin:
    def __init__(self, conf: dict[str, Any]) -> None:
        pass

    def list_topics(self, timeout: float) -> Any:
        return SimpleNamespace(brokers={1: "broker"})


@pytest.fixture(autouse=True)
def database_and_kafka_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stackcheck.psycopg, "connect", lambda *a, **kw: _Connection())
    monkeypatch.setattr(stackcheck, "AdminClient", _Admin)


def _settings(base: str, **overrides: str) -> StackSettings:
    fields = {
        "schema_registry_url": f"{base}/apis/ccompat/v7",
        "connect_url": base,
        "prometheus_url": base,
        "alertmanager_url": f"{base}/",  # a trailing slash is not doubled
        **overrides,
    }
    return StackSettings(**fields)  # type: ignore[arg-type]


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_stack_whose_components_all_answer_has_no_problems(server: tuple[str, type[_Answers]]) -> None:
    base, handler = server
    assert stackcheck.problems(_settings(base)) == {}
    assert set(handler.seen) >= {"/apis/ccompat/v7/subjects", "/connectors", "/-/ready"}
    assert "//-/ready" not in handler.seen


@pytest.mark.parametrize("component", ["prometheus", "alertmanager"])
def test_prometheus_and_alertmanager_are_probed_on_their_readiness(
    server: tuple[str, type[_Answers]], component: str
) -> None:
    base, _ = server
    found = stackcheck.problems(_settings(base, **{f"{component}_url": _closed_port_url()}))
    assert set(found) == {component}
    assert "URLError" in found[component]


def test_not_ready_is_a_problem(server: tuple[str, type[_Answers]]) -> None:
    base, handler = server
    handler.status["/-/ready"] = 503  # both serve /-/ready: neither is ready yet
    found = stackcheck.problems(_settings(base))
    assert set(found) == {"prometheus", "alertmanager"}
    assert "503" in found["prometheus"]


def test_every_component_of_the_local_stack_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise ConnectionRefusedError("down")

    monkeypatch.setattr(stackcheck.psycopg, "connect", refuse)
    monkeypatch.setattr(stackcheck, "_http_ok", refuse)

    class _NoBrokers(_Admin):
        def list_topics(self, timeout: float) -> Any:
            return SimpleNamespace(brokers={})

    monkeypatch.setattr(stackcheck, "AdminClient", _NoBrokers)
    found = stackcheck.problems(StackSettings())
    assert set(found) == {"postgres", "kafka", "registry", "connect", "prometheus", "alertmanager"}
    assert found["kafka"] == "no brokers in metadata"
