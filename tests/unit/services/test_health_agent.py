"""The health agent's pure logic: hysteresis, verification windows, metrics parsing."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.health_agent.detector import Change, DetectorState, Hysteresis, Phase, is_breaching, observe
from services.health_agent.metrics_source import Sample, ScrapeError, parse
from services.health_agent.scrape import starting_at
from services.health_agent.verification import Verdict, Window, observe_nothing
from services.health_agent.verification import observe as observe_window

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
RULE = Hysteresis(open_after=3, clear_after=2)


def run(pattern: str, rule: Hysteresis = RULE, state: DetectorState | None = None) -> list[Change]:
    """Feed scrapes ('B' breaching, '.' healthy) one second apart; the changes they cause."""
    state = state or DetectorState()
    changes = []
    for i, scrape in enumerate(pattern):
        state, change = observe(state, breaching=scrape == "B", at=T0 + timedelta(seconds=i), rule=rule)
        changes.append(change)
    return changes


def opened(pattern: str, rule: Hysteresis = RULE) -> int:
    return run(pattern, rule).count(Change.OPENED)


# ----------------------------------------------------------------- hysteresis


def test_breach_is_strictly_above_the_threshold() -> None:
    assert is_breaching(501, 500)
    assert not is_breaching(500, 500)


def test_k_consecutive_breaching_scrapes_open_one_incident() -> None:
    assert run("BBB") == [Change.NONE, Change.NONE, Change.OPENED]


def test_fewer_than_k_breaching_scrapes_open_nothing() -> None:
    assert opened("BB.BB.BB.") == 0


def test_a_healthy_scrape_resets_the_breach_count() -> None:
    assert run("BB.BBB")[-1] is Change.OPENED
    assert opened("BB.BB") == 0


def test_a_breach_that_goes_on_never_opens_a_second_incident() -> None:
    assert opened("B" * 500) == 1


def test_a_single_healthy_scrape_inside_a_breach_does_not_clear_it() -> None:
    # M = 2: one fast scrape in the middle of an outage is noise, not recovery
    changes = run("BBB.BBB.BBB")
    assert changes.count(Change.OPENED) == 1
    assert Change.CLEARED not in changes


def test_m_consecutive_healthy_scrapes_clear_the_breach() -> None:
    assert run("BBB..") == [Change.NONE, Change.NONE, Change.OPENED, Change.NONE, Change.CLEARED]


def test_a_new_breach_after_clearing_opens_a_new_incident() -> None:
    changes = run("BBB..BBB")
    assert changes.count(Change.OPENED) == 2
    assert changes.index(Change.CLEARED) < len(changes) - 1


def test_breaching_scrape_resets_the_healthy_count() -> None:
    changes = run("BBB.B.B.B")
    assert Change.CLEARED not in changes


def test_breach_start_is_the_first_scrape_of_the_run() -> None:
    state = DetectorState()
    for i, scrape in enumerate("B.BBB"):
        state, _ = observe(state, breaching=scrape == "B", at=T0 + timedelta(seconds=i), rule=RULE)
    assert state.phase is Phase.BREACHING
    assert state.breach_started_at == T0 + timedelta(seconds=2)


def test_k_and_m_of_one_behave_like_no_hysteresis() -> None:
    assert run("B.B.", Hysteresis(1, 1)) == [Change.OPENED, Change.CLEARED, Change.OPENED, Change.CLEARED]


def test_hysteresis_counts_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Hysteresis(0, 1)


# ------------------------------------------------------------- verification

W = timedelta(seconds=5)
GAP = timedelta(seconds=3)


def verify(samples: list[tuple[float, float]], window: Window | None = None) -> tuple[Window, list[Verdict | None]]:
    """(seconds after start, p95) samples against a 500 ms threshold."""
    window = window or Window(started_at=T0, length=W)
    verdicts = []
    for seconds, p95 in samples:
        window, outcome = observe_window(
            window, p95_ms=p95, threshold_ms=500, at=T0 + timedelta(seconds=seconds), max_gap=GAP
        )
        verdicts.append(None if outcome is None else outcome.verdict)
    return window, verdicts


def test_healthy_for_the_whole_window_completes() -> None:
    _, verdicts = verify([(s, 300) for s in range(7)])
    assert verdicts == [None] * 5 + [Verdict.COMPLETED, Verdict.COMPLETED]
    # (the caller stops at the first verdict; the window itself does not remember)


def test_completion_reports_the_highest_p95_of_the_healthy_run() -> None:
    window = Window(started_at=T0, length=W)
    for s, p95 in [(0, 200), (1, 450), (2, 300), (3, 250), (4, 100)]:
        window, outcome = observe_window(
            window, p95_ms=p95, threshold_ms=500, at=T0 + timedelta(seconds=s), max_gap=GAP
        )
        assert outcome is None
    _, outcome = observe_window(window, p95_ms=120, threshold_ms=500, at=T0 + timedelta(seconds=5), max_gap=GAP)
    assert outcome is not None and outcome.verdict is Verdict.COMPLETED
    assert outcome.p95_ms == 450
    assert outcome.threshold_ms == 500


def test_still_breaching_when_the_window_ends_fails() -> None:
    _, verdicts = verify([(s, 1800) for s in range(6)])
    assert verdicts == [None] * 5 + [Verdict.FAILED]


def test_failure_reports_the_breaching_p95() -> None:
    window = Window(started_at=T0, length=W)
    _, outcome = observe_window(window, p95_ms=1800, threshold_ms=500, at=T0 + W, max_gap=GAP)
    assert outcome is not None and outcome.verdict is Verdict.FAILED
    assert outcome.p95_ms == 1800
    assert "1800" in outcome.reason


def test_a_breach_early_in_the_window_only_restarts_the_healthy_run() -> None:
    # the fix takes two seconds to bite: healthy from t=2, so complete at t=7
    _, verdicts = verify([(0, 1800), (1, 1800), *[(s, 300) for s in range(2, 8)]])
    assert verdicts == [None] * 7 + [Verdict.COMPLETED]


def test_a_relapse_after_the_window_end_fails() -> None:
    _, verdicts = verify([(0, 1800), (4, 300), (5, 300), (6, 900)])
    assert verdicts == [None, None, None, Verdict.FAILED]


def test_samples_before_the_window_opened_are_ignored() -> None:
    window = Window(started_at=T0, length=W)
    same, outcome = observe_window(window, p95_ms=9000, threshold_ms=500, at=T0 - timedelta(seconds=1), max_gap=GAP)
    assert (same, outcome) == (window, None)


def test_a_gap_in_the_samples_restarts_the_healthy_run() -> None:
    # healthy at 0..2, then nothing until 7 (gap 5 s > 3 s): the run restarts at 7
    _, verdicts = verify([(0, 300), (1, 300), (2, 300), (7, 300), (8, 300), (11, 300), (12, 300)])
    assert verdicts == [None] * 6 + [Verdict.COMPLETED]


def test_a_replicas_older_sample_folded_after_a_newer_one_changes_nothing() -> None:
    """Two health replicas fold their scrapes into the same window in either order: one
    taken before the newest already folded neither rewinds the window nor restarts its run."""
    window, verdicts = verify([(0, 300), (2, 300)])
    late, outcome = observe_window(window, p95_ms=1800, threshold_ms=500, at=T0 + timedelta(seconds=1), max_gap=GAP)
    assert (late, outcome) == (window, None)
    _, verdicts = verify([(3, 300), (5, 300)], window=late)
    assert verdicts == [None, Verdict.COMPLETED]


def test_no_samples_at_all_is_unverifiable_after_three_windows() -> None:
    window, outcome = observe_nothing(Window(started_at=T0, length=W), at=T0)  # looked at from the start
    assert outcome is None
    assert observe_nothing(window, at=T0 + 3 * W - timedelta(milliseconds=1))[1] is None
    _, outcome = observe_nothing(window, at=T0 + 3 * W)
    assert outcome is not None and outcome.verdict is Verdict.UNVERIFIABLE
    assert outcome.p95_ms is None


def test_every_window_is_decided_within_three_windows_even_with_sparse_samples() -> None:
    # healthy samples 4 s apart (gap > 3 s) never form a 5 s run
    _, verdicts = verify([(s, 300) for s in range(0, 17, 4)])
    assert verdicts[-1] is Verdict.UNVERIFIABLE
    assert all(v is None for v in verdicts[:-1])


def _at_cadence(samples: list[tuple[float, float]], cadence: float) -> list[Verdict | None]:
    window = Window(started_at=T0, length=W)
    verdicts = []
    for seconds, p95 in samples:
        window, outcome = observe_window(
            window,
            p95_ms=p95,
            threshold_ms=500,
            at=T0 + timedelta(seconds=seconds),
            max_gap=GAP,
            cadence=timedelta(seconds=cadence),
        )
        verdicts.append(None if outcome is None else outcome.verdict)
    return verdicts


def test_a_slow_agent_still_verifies_from_every_tick_it_took() -> None:
    """A storm stretches the agent's ticks to 4 s: the same samples that are gaps for an
    agent ticking every second are every look it took, and form a 5 s run."""
    assert _at_cadence([(s, 300) for s in range(0, 9, 4)], cadence=4) == [None, None, Verdict.COMPLETED]


def test_a_slow_agent_still_restarts_the_run_on_a_breach() -> None:
    verdicts = _at_cadence([(0, 300), (4, 900), (8, 300), (12, 300)], cadence=4)
    assert verdicts == [None, None, None, None]  # the run restarted at 8 s: 4 s < W


def test_an_unobserved_stretch_longer_than_the_window_is_never_a_run() -> None:
    """A frozen agent (nothing recorded for 19 s) has not watched the service: two healthy
    samples around the freeze prove nothing. The freeze is the agent's, though: the window's
    time is counted from the end of it."""
    window = Window(started_at=T0, length=W)
    window, outcome = observe_window(window, p95_ms=300, threshold_ms=500, at=T0, max_gap=GAP)
    thawed = T0 + timedelta(seconds=19)
    cadence = timedelta(seconds=19)  # the agent's last recorded scrape was the one at T0
    window, outcome = observe_window(window, p95_ms=300, threshold_ms=500, at=thawed, max_gap=GAP, cadence=cadence)
    assert outcome is None and window.run_started_at == thawed
    assert window.watched_from == thawed
    _, late = observe_nothing(window, at=thawed + 3 * W)
    assert late is not None and late.verdict is Verdict.UNVERIFIABLE  # watched 3W after the freeze: given up


def test_an_agent_blind_for_a_while_still_verifies_once_it_sees_again() -> None:
    """PostgreSQL killed under the agent: no tick recorded anything for 12 s, longer than
    3W would allow from the first look. The recovery is verified from the samples after."""
    window, _ = observe_window(Window(started_at=T0, length=W), p95_ms=300, threshold_ms=500, at=T0, max_gap=GAP)
    back = 12
    window, outcome = observe_window(
        window,
        p95_ms=300,
        threshold_ms=500,
        at=T0 + timedelta(seconds=back),
        max_gap=GAP,
        cadence=timedelta(seconds=back),
    )
    assert outcome is None
    verdicts = []
    for s in range(back + 1, back + 6):
        window, outcome = observe_window(
            window,
            p95_ms=300,
            threshold_ms=500,
            at=T0 + timedelta(seconds=s),
            max_gap=GAP,
            cadence=timedelta(seconds=1),
        )
        verdicts.append(None if outcome is None else outcome.verdict)
    assert verdicts == [None, None, None, None, Verdict.COMPLETED]


def test_a_gap_in_one_service_s_samples_while_the_agent_looked_still_counts() -> None:
    # The agent recorded a scrape every second; this service was missing from them for 11 s.
    window = Window(started_at=T0, length=W)
    second = timedelta(seconds=1)
    window, _ = observe_window(window, p95_ms=300, threshold_ms=500, at=T0, max_gap=GAP, cadence=second)
    window, outcome = observe_window(
        window, p95_ms=300, threshold_ms=500, at=T0 + timedelta(seconds=11), max_gap=GAP, cadence=second
    )
    assert outcome is None and window.watched_from == T0  # not moved on: the agent was looking
    window, outcome = observe_window(window, p95_ms=300, threshold_ms=500, at=T0 + 3 * W, max_gap=GAP, cadence=second)
    assert outcome is not None and outcome.verdict is Verdict.UNVERIFIABLE


def test_a_slow_agent_gets_more_time_before_a_window_is_given_up() -> None:
    window = Window(started_at=T0, length=W)
    assert window.gives_up_by(timedelta(seconds=1)) == T0 + 3 * W  # the usual three windows
    assert window.gives_up_by(timedelta(seconds=4)) == T0 + W + 3 * timedelta(seconds=4)
    assert observe_nothing(window, at=T0 + 3 * W, cadence=timedelta(seconds=4))[1] is None


def test_a_window_opened_during_a_long_tick_gets_its_time_from_the_agent_s_first_look() -> None:
    """A burst of incident openings held one tick for 30 s; the windows opened meanwhile
    were first looked at 32 s after they started, past 3W: that is not 'gaps', the agent
    had not looked yet."""
    window = Window(started_at=T0, length=W)
    first = T0 + timedelta(seconds=32)
    window, outcome = observe_window(window, p95_ms=300, threshold_ms=500, at=first, max_gap=GAP)
    assert outcome is None and window.watched_from == first
    for s in (33, 34, 35, 36):
        window, outcome = observe_window(
            window, p95_ms=300, threshold_ms=500, at=T0 + timedelta(seconds=s), max_gap=GAP
        )
        assert outcome is None
    window, outcome = observe_window(window, p95_ms=300, threshold_ms=500, at=T0 + timedelta(seconds=37), max_gap=GAP)
    assert outcome is not None and outcome.verdict is Verdict.COMPLETED


def test_the_first_look_is_kept_and_counts_a_look_without_a_sample() -> None:
    window, outcome = observe_nothing(Window(started_at=T0, length=W), at=T0 + timedelta(seconds=40))
    assert outcome is None and window.watched_from == T0 + timedelta(seconds=40)
    window, outcome = observe_nothing(window, at=T0 + timedelta(seconds=40) + 3 * W)
    assert outcome is not None and outcome.verdict is Verdict.UNVERIFIABLE
    assert window.watched_from == T0 + timedelta(seconds=40)


# ----------------------------------------------------------------- metrics

SIM_METRICS = """\
# HELP sim_latency_p95_ms p95 latency of a service
# TYPE sim_latency_p95_ms gauge
sim_latency_p95_ms{service="checkout-api"} 1800.0
sim_latency_p95_ms{service="payments-api"} 120.5
sim_latency_p95_ms{service="no-threshold"} 10
# TYPE sim_latency_threshold_ms gauge
sim_latency_threshold_ms{service="checkout-api"} 500
sim_latency_threshold_ms{service="payments-api"} 300
# TYPE sim_replicas gauge
sim_replicas{service="checkout-api"} 4
sim_dependency_latency_p95_ms{service="checkout-api",dependency="payments-api"} 1700
"""


def test_parse_reads_p95_and_threshold_per_service() -> None:
    samples = {s.service: s for s in parse(SIM_METRICS, "production")}
    assert set(samples) == {"checkout-api", "payments-api"}  # no threshold: not watched
    assert samples["checkout-api"].p95_ms == 1800.0
    assert samples["checkout-api"].threshold_ms == 500.0
    assert samples["payments-api"].environment == "production"


def test_parse_honours_an_environment_label() -> None:
    text = (
        'sim_latency_p95_ms{service="api",environment="dev"} 900\n'
        'sim_latency_threshold_ms{service="api",environment="dev"} 500\n'
        'sim_latency_p95_ms{service="api"} 100\n'
        'sim_latency_threshold_ms{service="api"} 500\n'
    )
    samples = {s.key: s.p95_ms for s in parse(text, "production")}
    assert samples == {("dev", "api"): 900.0, ("production", "api"): 100.0}


def test_parse_refuses_what_is_not_prometheus_text() -> None:
    with pytest.raises(ScrapeError):
        parse("{not: prometheus", "production")


def test_an_alert_still_firing_keeps_a_healthy_run_from_completing() -> None:
    """An error-rate alert opened the incident; its latency was fine all along."""
    window = Window(started_at=T0, length=W)
    grace = timedelta(seconds=10)
    for s in range(0, 15):
        window, outcome = observe_window(
            window,
            p95_ms=200,
            threshold_ms=500,
            at=T0 + timedelta(seconds=s),
            max_gap=GAP,
            firing_alert="HighErrorRate",
            alert_grace=grace,
        )
        assert outcome is None  # not failed until W + grace, never completed while it fires
    window, outcome = observe_window(
        window, p95_ms=200, threshold_ms=500, at=T0 + W + grace, max_gap=GAP, firing_alert="HighErrorRate",
        alert_grace=grace,
    )  # fmt: skip
    assert outcome is not None and outcome.verdict is Verdict.UNVERIFIABLE  # a person decides
    assert "HighErrorRate" in outcome.reason and "still firing 15 s" in outcome.reason


def test_a_resolved_alert_lets_the_healthy_run_complete() -> None:
    window = Window(started_at=T0, length=W)
    for s in range(0, 3):
        window, outcome = observe_window(
            window, p95_ms=200, threshold_ms=500, at=T0 + timedelta(seconds=s), max_gap=GAP, firing_alert="Errors"
        )
        assert outcome is None
    verdicts = []
    for s in range(3, 9):
        window, outcome = observe_window(
            window, p95_ms=200, threshold_ms=500, at=T0 + timedelta(seconds=s), max_gap=GAP
        )
        verdicts.append(None if outcome is None else outcome.verdict)
    assert verdicts == [None] * 5 + [Verdict.COMPLETED]  # W of healthy readings after the resolution


def test_the_agents_own_blind_stretch_does_not_count_when_its_first_reading_lacks_the_service() -> None:
    """Prometheus restarted: no reading for anyone for seconds, then a reading without this
    service yet. The blind stretch is the agent's; the window still has its time."""
    window = Window(started_at=T0, length=W)
    window, _ = observe_nothing(window, at=T0)  # first look
    window, outcome = observe_nothing(window, at=T0 + timedelta(seconds=14), blind=timedelta(seconds=10))
    assert outcome is None and window.watched_from == T0 + timedelta(seconds=10)
    window, outcome = observe_nothing(window, at=T0 + timedelta(seconds=25))
    assert outcome is not None and outcome.verdict is Verdict.UNVERIFIABLE  # 3W of its own watching


def test_without_readings_a_firing_alert_waits_for_its_grace_then_a_person_decides() -> None:
    window = Window(started_at=T0, length=W)
    grace = timedelta(seconds=20)
    window, outcome = observe_nothing(
        window, at=T0 + timedelta(seconds=16), firing_alert="HighErrorRate", alert_grace=grace
    )
    assert outcome is None  # past 3W, but the alert may still resolve
    window, outcome = observe_nothing(window, at=T0 + W + grace, firing_alert="HighErrorRate", alert_grace=grace)
    assert outcome is not None and outcome.verdict is Verdict.UNVERIFIABLE and "HighErrorRate" in outcome.reason


def test_alert_payloads_are_alertmanagers_version_4() -> None:
    from pydantic import ValidationError

    from services.health_agent.alerts import Notification

    good = {
        "version": "4",
        "status": "firing",
        "receiver": "flotilla",
        "groupKey": '{}:{alertname="X"}',
        "truncatedAlerts": 0,
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": [
            {
                "status": "resolved",
                "labels": {"alertname": "ServiceLatencyHigh", "service_name": "checkout-api"},
                "annotations": {"summary": "slow"},
                "startsAt": "2026-12-06T12:00:00Z",
                "endsAt": "2026-12-06T12:05:00Z",
                "generatorURL": "http://prometheus/graph",
                "fingerprint": "c0ffee",
            },
            {
                "status": "firing",
                "labels": {"alertname": "ServiceLatencyHigh", "service_name": "checkout-api"},
                "annotations": {},
                "startsAt": "2026-12-06T12:10:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": "c0ffee",
            },
        ],
    }
    parsed = Notification.model_validate(good)
    assert [a.ended for a in parsed.alerts] == [datetime(2026, 12, 6, 12, 5, tzinfo=UTC), None]
    for broken in (
        {**good, "version": "3"},
        {**good, "alerts": [{**good["alerts"][0], "labels": {"service_name": "x"}}]},  # no alertname
        {**good, "alerts": [{**good["alerts"][0], "status": "pending"}]},
        {**good, "alerts": [{**good["alerts"][0], "fingerprint": ""}]},
        {**good, "alerts": [{**good["alerts"][0], "labels": {"alertname": "X", "n": 5}}]},  # labels are strings
        {**good, "alerts": "all of them"},
    ):
        with pytest.raises(ValidationError):
            Notification.model_validate(broken)


@pytest.mark.parametrize(
    ("labels", "signal"),
    [
        ({"alertname": "ServiceLatencyHigh"}, "latency"),
        ({"alertname": "HighErrorRate"}, "errors"),
        ({"alertname": "KubePodCrashLooping"}, "availability"),
        ({"alertname": "CPUThrottlingHigh"}, "saturation"),
        ({"alertname": "UpstreamTimeouts"}, "dependency"),
        ({"alertname": "Watchdog"}, "other"),
        ({"alertname": "HighErrorRate", "signal": "Latency"}, "latency"),  # the label wins
        ({"alertname": "HighErrorRate", "signal": "bogus"}, "errors"),
    ],
)
def test_the_kind_of_signal_comes_from_the_label_else_the_name(labels: dict[str, str], signal: str) -> None:
    from services.health_agent.alerts import signal_of

    assert signal_of(labels) == signal


def test_alert_senders_are_token_digests(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from flotilla.bearer import token_digest
    from services.health_agent.settings import HealthSettings

    for name in [n for n in os.environ if n.startswith("FLOTILLA_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(tmp_path / "absent.env"))
    monkeypatch.setenv("FLOTILLA_ALERT_TOKENS", f'[{{"name": "alertmanager", "sha256": "{token_digest("tok")}"}}]')
    senders, demo = HealthSettings.load().alert_senders()
    assert not demo
    found = senders.authenticate("Bearer tok")
    assert found is not None and found.name == "alertmanager"
    assert senders.authenticate("Bearer other") is None and senders.authenticate(None) is None
    monkeypatch.setenv("FLOTILLA_ALERT_TOKENS", "[]")
    with pytest.raises(ValueError, match="names no sender"):
        HealthSettings.load().alert_senders()
    monkeypatch.delenv("FLOTILLA_ALERT_TOKENS")
    from flotilla.settings import MissingCredentials

    with pytest.raises(MissingCredentials):  # production profile: no default sender
        HealthSettings.load().alert_senders()
    monkeypatch.setenv("FLOTILLA_HEALTH_OPEN_FROM", "alerts")
    assert HealthSettings.load().health_open_from == frozenset({"alerts"})
    monkeypatch.setenv("FLOTILLA_PROMQL_WINDOW", "30s")
    assert HealthSettings.load().metrics_lag_seconds() == 30.0
    monkeypatch.setenv("FLOTILLA_HEALTH_SOURCE", "scrape")
    assert HealthSettings.load().metrics_lag_seconds() == 0.0


def test_settings_come_from_flotilla_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from services.health_agent.settings import HealthSettings

    for name in [n for n in os.environ if n.startswith("FLOTILLA_")]:  # nothing of the shell leaks in
        monkeypatch.delenv(name)

    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(tmp_path / "absent.env"))
    defaults = HealthSettings.load()
    assert (defaults.health_scrape_seconds, defaults.health_verify_seconds) == (1.0, 5.0)
    assert defaults.sim_url == "http://127.0.0.1:18110"
    assert (defaults.service_name, defaults.service_database, defaults.http_port) == (
        "health-agent",
        "flotilla_health",
        18101,
    )
    monkeypatch.setenv("FLOTILLA_HEALTH_SCRAPE_SECONDS", "0.5")
    monkeypatch.setenv("FLOTILLA_HEALTH_VERIFY_SECONDS", "30")
    monkeypatch.setenv("FLOTILLA_SIM_URL", "http://sim:18110")
    settings = HealthSettings.load()
    assert (settings.health_scrape_seconds, settings.health_verify_seconds) == (0.5, 30.0)
    assert settings.sim_url == "http://sim:18110"


# ----------------------------------------------------- deferred detections, in turn


def samples_of(*names: str) -> list[Sample]:
    return [Sample(service=name, environment="production", p95_ms=900.0, threshold_ms=500.0) for name in names]


def test_a_tick_with_nothing_left_over_takes_the_samples_in_key_order() -> None:
    assert [s.service for s in starting_at(samples_of("c", "a", "b"), None)] == ["a", "b", "c"]


def test_a_tick_resumes_at_the_sample_the_last_one_left_over_and_wraps_around() -> None:
    ordered = starting_at(samples_of("a", "b", "c", "d"), ("production", "c"))
    assert [s.service for s in ordered] == ["c", "d", "a", "b"]


def test_a_left_over_service_that_is_gone_resumes_at_the_next_one() -> None:
    assert [s.service for s in starting_at(samples_of("a", "b", "d"), ("production", "c"))] == ["d", "a", "b"]
    assert [s.service for s in starting_at(samples_of("a", "b"), ("production", "z"))] == ["a", "b"]


@given(st.integers(min_value=1, max_value=60), st.integers(min_value=1, max_value=7))
def test_services_that_keep_changing_never_starve_the_ones_behind_them(services: int, per_tick: int) -> None:
    # Worst case for fairness: every sample goes the long way every tick (none settles),
    # and a tick has time for only ``per_tick`` of them.
    estate = samples_of(*(f"svc-{i:02d}" for i in range(services)))
    served: dict[str, int] = {}
    resume: tuple[str, str] | None = None
    for tick in range(-(-services // per_tick)):
        ordered = starting_at(estate, resume)
        for sample in ordered[:per_tick]:
            served.setdefault(sample.service, tick)
        resume = ordered[per_tick].key if per_tick < len(ordered) else None
    assert len(served) == services  # each one within ceil(services / per_tick) ticks


def test_a_lost_resolution_is_found_out_from_the_rules_prometheus() -> None:
    import httpx
    from flotilla_evidence import PrometheusClient

    from services.health_agent.reconcile import RuleStates

    rule = {"__name__": "ALERTS", "alertname": "ServiceLatencyHigh", "service_name": "shop-0001", "signal": "latency"}
    answers = {
        'ALERTS{alertstate="firing"}': [{**rule, "service_name": "shop-0002", "alertstate": "firing"}],
        "last_over_time(ALERTS[15m])": [
            {**rule, "alertstate": "firing"},
            {**rule, "service_name": "shop-0002", "alertstate": "firing"},
        ],
    }

    def prometheus(request: httpx.Request) -> httpx.Response:
        query = dict(httpx.QueryParams(request.content.decode()))["query"]
        result = [{"metric": m, "value": [0, "1"]} for m in answers[query]]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    states = RuleStates(PrometheusClient("http://prometheus.test", transport=httpx.MockTransport(prometheus)))
    alert = {"alertname": "ServiceLatencyHigh", "service_name": "shop-0001", "signal": "latency", "region": "eu"}
    assert states.resolved(
        [
            alert,  # Prometheus made it and it fires no more: resolved (the external label is Alertmanager's)
            {**alert, "service_name": "shop-0002"},  # still firing
            {"alertname": "HighErrorRate", "service_name": "shop-0001"},  # not this Prometheus' alert: unknown
        ]
    ) == [True, False, False]
    down = RuleStates(PrometheusClient("http://127.0.0.1:9", timeout=1))
    assert down.resolved([alert]) == [False]  # cannot tell: it keeps firing
