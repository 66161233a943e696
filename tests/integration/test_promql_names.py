"""Names in PromQL, asked of a real Prometheus (security review 3, M3).

Two parts. The escaping as Prometheus itself reads it: for names hypothesis draws (quotes,
backslashes, regex syntax, control characters, U+FFFD, non-ASCII punctuation), the local
stack's Prometheus is asked read-only queries that set a label to the name through the
string literal and match it with ``name_regex`` (``label_replace`` anchors its regex as a
matcher does). Then series under such a name, scraped by a private Prometheus (the same
Debian binary, tests/support/prometheus.py): its neighbourhood reads correctly, merged in
one request with another incident's, and a reader whose name no request can carry fails
alone while the merged request answers everyone else.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from flotilla_evidence import EvidenceUnavailable, PrometheusClient, PrometheusEvidence, Queries, Topology
from flotilla_evidence.prometheus import Reading
from flotilla_evidence.queries import UnaskableName, name_regex, promql_string
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flotilla.settings import StackSettings
from tests.fakes.fake_openai import ThreadedServer
from tests.support.prometheus import PrivatePrometheus

pytestmark = pytest.mark.timeout(300)

# A name with everything the old escaping broke on: a quote, a backslash, regex syntax and a
# non-ASCII punctuation mark. Printable and short: a name the estate's bounds let through.
ODD = 'pay"ments\\eu|v1.2·ok'
WINDOW = "5s"
T = TypeVar("T")

SPECIAL = '"\\|.*+?()[]{}^$·–…\n\r\t\x00\x07\x7f\x85\ufffd\u2028 '
characters = st.one_of(st.sampled_from(SPECIAL), st.characters(exclude_categories=["Cs"]))
names = st.text(characters, min_size=1, max_size=30)


@pytest.fixture(scope="module")
def stack_prometheus(stack: StackSettings) -> Iterator[PrometheusClient]:
    client = PrometheusClient(stack.prometheus_url)
    assert client.query("vector(1)")[0].value == 1.0
    yield client
    client.close()


def matched(client: PrometheusClient, value: str, pattern_of: str) -> list[Reading]:
    """``vector(1)`` with label ``name`` set to ``value`` (through a string literal; ``$$``
    is label_replace's literal ``$``) and ``hit="yes"`` when ``name_regex([pattern_of])``
    matches it, as Prometheus evaluates it."""
    literal = promql_string(value.replace("$", "$$"))
    return client.query(
        f'label_replace(label_replace(vector(1), "name", "{literal}", "", ""), '
        f'"hit", "yes", "name", "{name_regex([pattern_of])}")'
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names, names)
@example(ODD, ODD.replace("·", "."))
@example('pay"ments', "payments")
@example("pay\\ments", "pay\\mentz")
@example("pay·ments", "pay.ments")
@example("a\nb", "a\\nb")
@example("\ufffd", "?")
def test_prometheus_reads_each_name_as_itself_and_its_matcher_matches_it_alone(
    stack_prometheus: PrometheusClient, name: str, other: str
) -> None:
    [itself] = matched(stack_prometheus, name, name)
    assert itself.labels["name"] == name  # the string literal carried it exactly
    assert itself.labels.get("hit") == "yes"  # the regex matched it
    [another] = matched(stack_prometheus, other, name)
    assert (another.labels.get("hit") == "yes") == (other == name)


# ------------------------------------------------------------------ series under such a name


class Exporter:
    """A target exposing what an instrumented estate would, for ``checkout-api`` (p95 97.5
    ms, calling ODD) and ODD (p95 242.5 ms): histograms whose counts grow with time."""

    def __init__(self) -> None:
        self.began = time.monotonic()
        self.app = FastAPI()
        self.app.get("/metrics", response_class=PlainTextResponse)(self.metrics)

    @staticmethod
    def label(value: str) -> str:  # the exposition format's escaping
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    def metrics(self) -> str:
        n = int(20 * (time.monotonic() - self.began)) + 1
        lines = ["# TYPE http_server_request_duration_seconds histogram"]
        for name, (under, over) in {"checkout-api": ("0.05", "0.1"), ODD: ("0.1", "0.25")}.items():
            labels = f'service_name="{self.label(name)}",deployment_environment_name="production"'
            for le, count in ((under, 0), (over, n), ("+Inf", n)):
                lines.append(f'http_server_request_duration_seconds_bucket{{{labels},le="{le}"}} {count}')
            lines += [
                f"http_server_request_duration_seconds_sum{{{labels}}} {n * float(over)}",
                f"http_server_request_duration_seconds_count{{{labels}}} {n}",
            ]
        lines.append("# TYPE slo_latency_p95_threshold_seconds gauge")
        for name in ("checkout-api", ODD):
            labels = f'service_name="{self.label(name)}",deployment_environment_name="production"'
            lines.append(f"slo_latency_p95_threshold_seconds{{{labels}}} 0.5")
        lines.append("# TYPE traces_service_graph_request_total counter")
        lines.append(f'traces_service_graph_request_total{{client="checkout-api",server="{self.label(ODD)}"}} {n}')
        return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivatePrometheus]:
    with (
        ThreadedServer(Exporter().app) as target,
        PrivatePrometheus(tmp_path_factory.mktemp("prometheus"), [f"127.0.0.1:{target.port}"]) as prometheus,
    ):
        yield prometheus


class HeldClient(PrometheusClient):
    """A client whose first instant query waits for ``release``: reads that arrive meanwhile
    gather behind it and go as one merged request. Records every query asked."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.asked: list[str] = []
        self.holding = threading.Event()
        self.release = threading.Event()

    def query(self, promql: str, at: Any = None) -> list[Reading]:
        self.asked.append(promql)
        if not self.holding.is_set():
            self.holding.set()
            assert self.release.wait(10)
        return super().query(promql, at)


def evidence_of(client: PrometheusClient, trusted_jobs: tuple[str, ...] = ()) -> PrometheusEvidence:
    return PrometheusEvidence(client, queries=Queries.with_overrides({}, WINDOW, trusted_jobs), graph="telemetry")


def eventually(probe: Callable[[], T | None], what: str, timeout: float = 60) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = probe()
        except EvidenceUnavailable:  # not scraped for long enough yet
            found = None
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(0.5)


def settled(source: PrometheusEvidence, around: str) -> Topology:
    def probe() -> Topology | None:
        topology = source.snapshot(around, environment="production")
        return topology if ODD in topology.services else None

    return eventually(probe, f"{around}'s neighbourhood with {ODD!r} in it")


def test_a_name_with_quotes_backslashes_and_regex_syntax_reads_correctly(scraped: PrivatePrometheus) -> None:
    source = evidence_of(PrometheusClient(scraped.url))
    odd = settled(source, ODD).services[ODD]
    assert odd.p95_ms == pytest.approx(242.5, abs=0.5) and odd.threshold_ms == 500.0
    checkout = settled(source, "checkout-api")
    assert checkout.services["checkout-api"].dependencies == (ODD,)  # the service graph's edge
    assert checkout.services["checkout-api"].p95_ms == pytest.approx(97.5, abs=0.5)
    assert checkout.services[ODD].p95_ms == pytest.approx(242.5, abs=0.5)


def test_merged_with_another_incidents_read_it_fails_nobody_and_a_bad_name_fails_alone(
    scraped: PrivatePrometheus,
) -> None:
    settled(evidence_of(PrometheusClient(scraped.url)), "checkout-api")  # scraped long enough
    client = HeldClient(scraped.url)
    source = evidence_of(client)
    found: dict[str, Any] = {}

    def read(key: str, around: str) -> None:
        try:
            found[key] = source.snapshot(around, environment="production")
        except Exception as exc:  # the test reads what each reader got
            found[key] = exc

    first = threading.Thread(target=read, args=("first", "checkout-api"))
    first.start()
    assert client.holding.wait(10)  # the first request is held: what follows gathers behind it
    readers = [
        threading.Thread(target=read, args=args)
        for args in (("odd", ODD), ("checkout", "checkout-api"), ("surrogate", "pay\ud800ments"), ("long", "x" * 300))
    ]
    for thread in readers:
        thread.start()
    time.sleep(0.5)
    client.release.set()
    for thread in (first, *readers):
        thread.join(30)

    merged = [q for q in client.asked if "checkout-api|" + name_regex([ODD]) in q]
    assert merged, client.asked  # the odd name and checkout-api went in one request
    for key in ("first", "checkout"):
        assert found[key].services["checkout-api"].p95_ms == pytest.approx(97.5, abs=0.5), found[key]
    assert found["odd"].services[ODD].p95_ms == pytest.approx(242.5, abs=0.5), found["odd"]
    assert isinstance(found["surrogate"], UnaskableName) and "UTF-8" in str(found["surrogate"])
    assert isinstance(found["long"], UnaskableName) and "253" in str(found["long"])


def test_trusted_jobs_scope_every_reading(scraped: PrivatePrometheus) -> None:
    """The private Prometheus scrapes its target as job ``estate``: trusted, the readings are
    there; only another job trusted, no series of this one counts (no p95: unavailable)."""
    settled(evidence_of(PrometheusClient(scraped.url), ("estate",)), "checkout-api")
    with pytest.raises(EvidenceUnavailable, match="no p95"):
        evidence_of(PrometheusClient(scraped.url), ("kube-state-metrics",)).snapshot(
            "checkout-api", environment="production"
        )
