"""Names read from telemetry that no record may carry are left out of a reading, logged
once and counted, never copied (security review 3, H2: a self-declared ``service_name``
of a megabyte made a record Kafka refused)."""

from __future__ import annotations

import logging

import pytest
from flotilla_evidence.estate import NAMES_LEFT_OUT
from hypothesis import given, settings
from hypothesis import strategies as st

from flotilla.bounds import NAME_MAX, name_problem

from .test_prometheus_evidence import NOW, Scripted, evidence, svc

LONG = "a" * (NAME_MAX + 1)


def left_out(label: str) -> float:
    return NAMES_LEFT_OUT.labels(label)._value.get()


def estate(*extra: tuple[dict[str, str], float], edges: list[tuple[dict[str, str], float]] | None = None) -> Scripted:
    return Scripted(
        {
            "http_server_request_duration_seconds": [(svc("checkout-api"), 900.0), *extra],
            "http_client_request_duration_seconds": [],
            "traces_service_graph_request_total": edges or [],
            "traces_service_graph_request_server_seconds": [],
            "slo_latency_p95_threshold_seconds": [(svc("checkout-api"), 500.0), *extra],
            "kube_deployment_spec_replicas": [],
        },
        {
            "target_info": [
                ({**svc("checkout-api"), "service_version": "v1\nforged"}, [[NOW.timestamp(), "1"]]),
            ],
            "http_server_request_duration_seconds": [],
        },
    )


def test_a_service_or_environment_that_is_not_a_name_is_never_watched(caplog: pytest.LogCaptureFixture) -> None:
    before = (left_out("service_name"), left_out("deployment_environment_name"))
    api = estate(
        (svc(LONG), 900.0),
        (svc("pay\u200bments"), 900.0),  # a zero-width space: not a name
        (svc("search-api", "x" * 300), 900.0),
        (svc("a" * NAME_MAX), 900.0),  # exactly at the bound: a name
    )
    source = evidence(api)
    with caplog.at_level(logging.WARNING, logger="flotilla_evidence.estate"):
        first = source.latency_readings()
        second = source.latency_readings()
    assert [r.service for r in first] == ["a" * NAME_MAX, "checkout-api"] == [r.service for r in second]
    assert {r.environment for r in first} == {"production"}
    # each refused name logged once however often it is read; its head only, never all of it
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3, warnings
    assert all(len(w) < 400 for w in warnings) and any("254 characters" in w for w in warnings)
    # counted every time it was read (p95 and threshold, twice)
    assert left_out("service_name") - before[0] == 8
    assert left_out("deployment_environment_name") - before[1] == 4


def test_a_dependency_or_revision_that_is_not_a_name_stays_out_of_the_snapshot() -> None:
    edges = [({"client": "checkout-api", "server": LONG}, 5.0), ({"client": "checkout-api", "server": "db"}, 5.0)]
    topology = evidence(estate(edges=edges), graph="telemetry").snapshot("checkout-api", environment="production")
    checkout = topology.services["checkout-api"]
    assert checkout.dependencies == ("db",)
    assert checkout.revision is None  # "v1\nforged" is no revision


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=NAME_MAX + 40))
def test_a_name_is_1_to_253_printable_characters(value: str) -> None:
    why = name_problem(value)
    assert (why is None) == (0 < len(value) <= NAME_MAX and value.isprintable())
    assert why is None or value not in why or len(value) < 3  # the reason never repeats the value
