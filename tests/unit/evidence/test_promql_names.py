"""Names in PromQL (flotilla_evidence.queries): escaped for RE2, then for the string literal;
a name that cannot be a label value left out of a merged request; queries scoped to trusted
jobs. The same escaping against the real Prometheus: tests/integration/test_promql_names.py."""

from __future__ import annotations

import re
import string
import threading
import time
from typing import Any

import httpx
import pytest
from flotilla_evidence import EvidenceSettings, PrometheusClient, PrometheusEvidence, Queries, parse_catalogue
from flotilla_evidence.queries import (
    DEFAULTS,
    NAME_MAX,
    UnaskableName,
    askable_scope,
    name_regex,
    promql_string,
    re2_literal,
    unaskable,
)
from hypothesis import example, given
from hypothesis import strategies as st

from tests.unit.evidence.test_prometheus_evidence import NOW, demo_estate

# Names as telemetry may carry them: any text, with PromQL's and RE2's special characters,
# control characters, U+FFFD and non-ASCII punctuation drawn often.
SPECIAL = string.punctuation + " ·–«»…\n\r\t\x00\x07\x7f\x85\ufffd\u2028"
characters = st.one_of(st.sampled_from(SPECIAL), st.characters(exclude_categories=["Cs"]))
names = st.text(characters, min_size=1, max_size=40)


def unquoted(body: str) -> str:
    """The text of ``"<body>"`` as Prometheus' lexer and strconv.Unquote read it, for the
    escapes the escaper may write; anything the lexer refuses raises here too."""
    out, i = [], 0
    while i < len(body):
        c = body[i]
        assert c != '"', f"an unescaped quote ends the literal at {i}: {body!r}"
        assert c != "\n", "the lexer refuses a raw newline in a string"
        assert c != "\ufffd", "the lexer reads U+FFFD as an invalid rune"
        if c != "\\":
            out.append(c)
            i += 1
            continue
        escape = body[i + 1 : i + 2]
        if escape in ('"', "\\"):
            out.append(escape)
            i += 2
        elif escape == "u":
            code = int(body[i + 2 : i + 6], 16)
            assert len(body[i + 2 : i + 6]) == 4 and not 0xD800 <= code < 0xE000, body
            out.append(chr(code))
            i += 6
        else:
            raise AssertionError(f"an escape the escaper never writes: \\{escape} in {body!r}")
    return "".join(out)


def as_re2(pattern: str) -> re.Pattern[str]:
    """The pattern as RE2 reads it, through Python's ``re`` (the same for what it holds:
    literals, ``|`` and escaped ASCII punctuation). RE2 refuses a backslash before anything
    but ASCII punctuation (``\\·``, ``\\m``), which ``re`` would take; checked first."""
    escapes = re.findall(r"\\(.)", pattern, flags=re.DOTALL)
    assert all(c in string.punctuation for c in escapes), f"an escape RE2 refuses in {pattern!r}"
    return re.compile(pattern, flags=re.DOTALL)


@given(names, names)
@example('pay"ments', "payments")  # the review's three: a quote ended the literal,
@example("pay\\ments", "pay\\mentz")  # a backslash made \m,
@example("pay·ments", "pay.ments")  # a non-ASCII punctuation mark an invalid RE2 escape
@example("a.b", "axb")
@example("a|b", "a")
def test_the_matcher_of_a_name_matches_that_name_and_no_other(name: str, other: str) -> None:
    pattern = as_re2(unquoted(name_regex([name])))
    assert pattern.fullmatch(name)
    assert (pattern.fullmatch(other) is not None) == (other == name)


@given(st.sets(names, min_size=1, max_size=6), names)
def test_the_matcher_of_several_names_matches_exactly_those(chosen: set[str], other: str) -> None:
    pattern = as_re2(unquoted(name_regex(chosen)))
    assert all(pattern.fullmatch(name) for name in chosen)
    assert (pattern.fullmatch(other) is not None) == (other in chosen)


@given(st.text(characters, max_size=40))
def test_the_two_steps_know_nothing_of_each_other(text: str) -> None:
    assert unquoted(promql_string(text)) == text  # the literal carries any text as it is
    assert as_re2(re2_literal(text)).fullmatch(text)  # the regex matches it, outside any literal
    assert not any(c in re2_literal(text) for c in ("\\·", "\\m"))


def test_common_names_read_as_themselves() -> None:
    assert name_regex(["checkout-api", "payments_v2", "ns/svc:8080"]) == "checkout-api|ns/svc:8080|payments_v2"
    assert name_regex(['pay"ments']) == 'pay\\\\\\"ments'  # RE2 \" then the literal's \\ and \"
    assert name_regex(["pay·ments"]) == "pay·ments"
    assert name_regex(None) == ".+"


def test_a_name_that_cannot_be_a_label_value_is_left_out() -> None:
    bad = ["", "x" * (NAME_MAX + 1), "pay\ud800ments"]
    assert [unaskable(name) is not None for name in bad] == [True, True, True]
    assert unaskable("x" * NAME_MAX) is None
    assert name_regex(["checkout-api", *bad]) == "checkout-api"
    with pytest.raises(UnaskableName, match="not valid UTF-8"):
        name_regex(["pay\ud800ments"])
    with pytest.raises(ValueError, match="no service at all"):
        name_regex([])
    # a read keeps its askable names per placeholder, and fails alone when one has none left
    assert askable_scope(frozenset({("services", "a"), ("services", ""), ("deployments", "a")})) == frozenset(
        {("services", "a"), ("deployments", "a")}
    )
    with pytest.raises(UnaskableName, match="longer than 253"):
        askable_scope(frozenset({("services", "a"), ("deployments", "x" * 300)}))


def test_a_reader_with_a_bad_name_fails_alone_and_the_merged_request_answers_the_others() -> None:
    """The review's case: a reader for checkout-api merged with one for a name no request can
    carry. Before, the merged request failed and with it every reader of it."""
    api = demo_estate()
    held = threading.Event()
    first = threading.Event()

    def slow(request: httpx.Request) -> httpx.Response:
        if not first.is_set():
            first.set()
            assert held.wait(5)  # the first request is held: the other readers merge behind it
        return api(request)

    client = PrometheusClient("http://prometheus.test", transport=httpx.MockTransport(slow))
    source = PrometheusEvidence(client, clock=lambda: NOW)
    found: dict[str, Any] = {}

    def read(name: str) -> None:
        try:
            found[name] = source.snapshot(name, environment="production")
        except Exception as exc:  # the test reads what each reader got
            found[name] = exc

    blocker = threading.Thread(target=read, args=("payments-api",))
    blocker.start()
    assert first.wait(5)
    readers = [threading.Thread(target=read, args=(n,)) for n in ("checkout-api", "pay\ud800ments", "y" * 300)]
    for thread in readers:
        thread.start()
    time.sleep(0.2)
    held.set()
    for thread in (blocker, *readers):
        thread.join(10)
    assert found["checkout-api"].services["checkout-api"].p95_ms == 1831.2
    assert isinstance(found["pay\ud800ments"], UnaskableName) and "UTF-8" in str(found["pay\ud800ments"])
    assert isinstance(found["y" * 300], UnaskableName) and "253" in str(found["y" * 300])
    assert all("\ud800" not in q and "y" * 300 not in q for q in api.asked)


def test_a_bad_dependency_never_reaches_a_request_of_its_caller() -> None:
    """Whichever layer drops it (the estate's name bounds on what it reads, or the screening
    of what a read may ask), the caller's neighbourhood is read without it."""
    api = demo_estate()
    api.series["traces_service_graph_request_total"].append(({"client": "checkout-api", "server": "z" * 300}, 5.0))
    client = PrometheusClient("http://p.test", transport=httpx.MockTransport(api))
    checkout = PrometheusEvidence(client, clock=lambda: NOW).snapshot("checkout-api", environment="production")
    assert checkout.services["checkout-api"].p95_ms == 1831.2
    assert all("z" * 300 not in q for q in api.asked)


def test_every_default_selector_is_scoped_to_the_trusted_jobs() -> None:
    trusted = Queries.with_overrides({}, "2m", ["kube-state-metrics", "otel.collector"])
    plain = Queries()
    for name, default in DEFAULTS.items():
        if not default:
            continue
        scoped = trusted.render(name, services=["a"], deployments=["a"])
        selectors = re.findall(r"\{[^}]*\}", scoped)
        assert selectors and all(s.startswith('{job=~"kube-state-metrics|otel\\\\.collector",') for s in selectors)
        assert "job" not in plain.render(name, services=["a"], deployments=["a"])  # empty: as before
        assert trusted.scoped_label(name) == plain.scoped_label(name)  # still merged and cut back
    own = Queries.with_overrides({"utilization": 'busy{${trusted}svc=~"$services"}'}, "2m", ["k"])
    assert own.render("utilization", services=["a"]) == 'busy{job=~"k",svc=~"a"}'
    with pytest.raises(ValueError, match="trusted jobs"):
        Queries(trusted_jobs=("",))


def test_the_trusted_jobs_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOTILLA_PROMETHEUS_TRUSTED_JOBS", " kube-state-metrics, otel-collector ,")
    settings = EvidenceSettings()
    assert settings.prometheus_trusted_jobs == ("kube-state-metrics", "otel-collector")
    assert 'job=~"kube-state-metrics|otel-collector",' in settings.promql_queries().render(
        "replicas", deployments=["a"]
    )
    monkeypatch.setenv("FLOTILLA_PROMETHEUS_TRUSTED_JOBS", "")
    assert EvidenceSettings().promql_queries().trusted_jobs == ()


def test_a_catalogue_threshold_wins_over_a_higher_exported_one() -> None:
    """``max by`` over every series: an exporter can only raise a threshold. Where the
    catalogue declares one, the exported one is not read, for the health agent too."""
    api = demo_estate()
    api.series["slo_latency_p95_threshold_seconds"].append(
        ({"service_name": "checkout-api", "deployment_environment_name": "production", "job": "rogue"}, 99999.0)
    )
    catalogue = parse_catalogue(
        {"services": [{"name": "checkout-api", "latency_threshold_ms": 500}]},
        origin="test",
        default_environment="production",
    )
    source = PrometheusEvidence(
        PrometheusClient("http://p.test", transport=httpx.MockTransport(api)), catalogue=catalogue, clock=lambda: NOW
    )
    readings = {(r.environment, r.service): r.threshold_ms for r in source.latency_readings()}
    assert readings[("production", "checkout-api")] == 500.0
    assert source.snapshot("checkout-api", environment="production").services["checkout-api"].threshold_ms == 500.0
