"""The metrics added for the dashboard: consumer lag, approvals waiting, fencing
rejections, LLM tokens. Each is driven through the code that sets it and read back from
the Prometheus registry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import REGISTRY

from flotilla import metrics
from flotilla.consumer import ConsumerLoop, LoopConfig
from flotilla.rawloop import RawLoop
from flotilla.settings import StackSettings


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def lag(consumer: str, topic: str, partition: str) -> float | None:
    return REGISTRY.get_sample_value(
        "flotilla_consumer_lag", {"consumer": consumer, "topic": topic, "partition": partition}
    )


def stats(partitions: dict[str, dict[str, int]], topic: str = "incidents") -> str:
    """librdkafka's statistics JSON, reduced to what ConsumerLag reads."""
    return json.dumps({"name": "rdkafka#consumer-1", "type": "consumer", "topics": {topic: {"partitions": partitions}}})


# ---------------------------------------------------------------- consumer lag


def test_consumer_lag_is_read_from_librdkafka_statistics() -> None:
    reporter = metrics.ConsumerLag("lag-a")
    reporter(stats({"0": {"consumer_lag": 7}, "3": {"consumer_lag": 0}, "-1": {"consumer_lag": 99}}))
    assert lag("lag-a", "incidents", "0") == 7
    assert lag("lag-a", "incidents", "3") == 0
    assert lag("lag-a", "incidents", "-1") is None  # librdkafka's internal unassigned partition


def test_a_partition_no_longer_reported_loses_its_series() -> None:
    reporter = metrics.ConsumerLag("lag-b")
    reporter(stats({"0": {"consumer_lag": 5}, "1": {"consumer_lag": 2}}))
    reporter(stats({"1": {"consumer_lag": 1}, "0": {"consumer_lag": -1}}))  # 0 revoked: lag unknown
    assert lag("lag-b", "incidents", "0") is None
    assert lag("lag-b", "incidents", "1") == 1
    reporter.clear()
    assert lag("lag-b", "incidents", "1") is None


def test_consumers_do_not_touch_each_others_series() -> None:
    first, second = metrics.ConsumerLag("lag-c1"), metrics.ConsumerLag("lag-c2")
    first(stats({"0": {"consumer_lag": 3}}))
    second(stats({"0": {"consumer_lag": 4}}))
    second(stats({}))
    assert lag("lag-c1", "incidents", "0") == 3
    assert lag("lag-c2", "incidents", "0") is None


def test_unreadable_statistics_change_nothing() -> None:
    reporter = metrics.ConsumerLag("lag-d")
    reporter(stats({"2": {"consumer_lag": 9}}))
    reporter("{not json")
    assert lag("lag-d", "incidents", "2") == 9


def _loop(**config: Any) -> ConsumerLoop:
    # Nothing connects: the librdkafka clients connect lazily.
    return ConsumerLoop(
        LoopConfig(name="lag-loop", topics=("incidents",), source="/t", **config),
        StackSettings(),
        serde=None,  # type: ignore[arg-type]
        pool=None,  # type: ignore[arg-type]
        handlers={},
    )


def test_the_consumer_loop_asks_librdkafka_for_statistics() -> None:
    loop = _loop()
    conf = loop.kafka_config()
    assert conf["statistics.interval.ms"] == LoopConfig.stats_interval_ms > 0
    assert conf["stats_cb"] is loop._lag and loop._lag.consumer == "lag-loop"
    assert conf["enable.auto.offset.store"] is False and conf["group.id"] == "lag-loop"


def test_statistics_can_be_turned_off_and_kafka_overrides_still_win() -> None:
    assert "stats_cb" not in _loop(stats_interval_ms=0).kafka_config()
    conf = _loop(kafka={"statistics.interval.ms": 1000, "fetch.wait.max.ms": 10}).kafka_config()
    assert conf["statistics.interval.ms"] == 1000 and conf["fetch.wait.max.ms"] == 10


def _raw_loop(**options: Any) -> RawLoop:
    # Nothing connects, and neither pool nor handler is used by the configuration.
    unused: Any = None
    return RawLoop(
        group="raw-lag", topics=("incidents.dlq",), bootstrap="127.0.0.1:1", pool=unused, handle=unused, **options
    )


def test_the_raw_loop_reports_lag_like_the_consumer_loop() -> None:
    loop = _raw_loop()
    conf = loop.kafka_config()
    assert conf["stats_cb"] is loop._lag and loop._lag.consumer == "raw-lag"
    assert conf["statistics.interval.ms"] == 5000
    assert conf["enable.auto.commit"] is True and conf["enable.auto.offset.store"] is False
    assert "stats_cb" not in _raw_loop(stats_interval_ms=0).kafka_config()


# ------------------------------------------------------------ approvals waiting


class _Conn:
    def __init__(self, count: int) -> None:
        self.count = count
        self.queries: list[str] = []

    def execute(self, query: str, *args: object) -> Any:
        self.queries.append(query)
        return SimpleNamespace(fetchone=lambda: (self.count,))


class _Pool:
    def __init__(self, conn: _Conn) -> None:
        self.conn = conn

    @contextmanager
    def connection(self) -> Iterator[_Conn]:
        yield self.conn


def test_the_expiry_sweep_counts_the_approvals_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.policy import approvals

    expired: list[object] = []
    monkeypatch.setattr(approvals, "expire", lambda svc: expired.append(svc) or [])
    conn = _Conn(3)
    svc = SimpleNamespace(pool=_Pool(conn), stopping=SimpleNamespace(is_set=lambda: False))
    approvals.sweep(svc)  # type: ignore[arg-type]
    assert value("flotilla_policy_approvals_pending") == 3
    assert expired == [svc]  # expiry first, so an expired proposal is not counted as waiting
    assert "status = 'pending'" in conn.queries[-1]
    conn.count = 0
    approvals.sweep(svc)  # type: ignore[arg-type]
    assert value("flotilla_policy_approvals_pending") == 0


# ---------------------------------------------------------- fencing rejections


def _lease() -> Any:
    from services.executor.leases import Lease

    return Lease("production/checkout-api", "executor-a", 4, datetime.now(UTC) + timedelta(seconds=15))


class _NoRow:
    def execute(self, *args: object) -> Any:
        return SimpleNamespace(fetchone=lambda: None)


def test_a_fenced_write_of_the_executor_that_matches_no_row_is_counted() -> None:
    from services.executor import idempotency, leases

    before = value("flotilla_executor_fencing_rejections_total", by="executor")
    with pytest.raises(leases.LeaseLost):
        leases.renew(_NoRow(), _lease(), 15)  # type: ignore[arg-type]
    with pytest.raises(leases.LeaseLost):
        leases.release(_NoRow(), _lease())  # type: ignore[arg-type]
    with pytest.raises(leases.LeaseLost):
        idempotency.settle(_NoRow(), "incident-1:scale:12", _lease(), state=idempotency.State.APPLIED)  # type: ignore[arg-type]
    assert value("flotilla_executor_fencing_rejections_total", by="executor") == before + 3


def test_a_stale_fencing_token_refused_by_the_target_is_counted() -> None:
    from services.executor import commands
    from services.executor.execution import STALE_FENCING_TOKEN, Executor, ExecutorConfig, Failed
    from services.executor.targets import StaleFencingToken

    class Refusing:
        def apply(self, *args: object, **kwargs: object) -> Any:
            raise StaleFencingToken(4, 5)

        def lookup(self, key: str) -> None:
            return None

    now = datetime.now(UTC)
    step = commands.from_record(
        commands.SCALE,
        {
            "commandId": "c0ffee00-0000-4000-8000-000000000001",
            "idempotencyKey": "incident-1:scale:12",
            "incidentId": "incident-1",
            "proposalId": "c0ffee00-0000-4000-8000-000000000002",
            "target": {"kind": "service", "environment": "production", "name": "checkout-api"},
            "replicas": 12,
            "issuedAt": now,
            "expiresAt": now + timedelta(minutes=15),
        },
    )
    session = Executor(None, Refusing(), ExecutorConfig("executor-a")).session()  # type: ignore[arg-type]
    before = value("flotilla_executor_fencing_rejections_total", by="target")
    begun = SimpleNamespace(in_doubt=False, execution=SimpleNamespace(attempts=1))
    outcome = session.act(step, _lease(), begun, now)  # type: ignore[arg-type]
    assert isinstance(outcome, Failed) and outcome.error_class == STALE_FENCING_TOKEN
    assert value("flotilla_executor_fencing_rejections_total", by="target") == before + 1


# ------------------------------------------------------------------ LLM tokens


@pytest.fixture(scope="module")
def model_server() -> Iterator[Any]:
    from tests.fakes.fake_openai import FakeOpenAI

    with FakeOpenAI() as fake:
        yield fake


def test_llm_tokens_are_counted_by_model_and_kind(model_server: Any) -> None:
    from flotilla_reasoning import LLMReasoner

    from tests.fakes.fake_openai import Answer, diagnosis_answer
    from tests.unit.services.test_reasoner_rules import INCIDENT, demo_topology, evidence

    model_server.reset()
    model_server.script(Answer(json.dumps(diagnosis_answer(INCIDENT)), prompt_tokens=812, completion_tokens=95))
    reasoner = LLMReasoner(base_url=model_server.base_url, model="tokens-model", timeout=5, max_retries=0)
    reasoner.diagnose(evidence(demo_topology()))
    assert value("flotilla_llm_tokens_total", model="tokens-model", kind="prompt") == 812
    assert value("flotilla_llm_tokens_total", model="tokens-model", kind="completion") == 95


def test_llm_tokens_of_rejected_answers_are_counted_too(model_server: Any) -> None:
    from flotilla_reasoning import LLMReasoner, ReasoningFailed

    from tests.fakes.fake_openai import MALFORMED
    from tests.unit.services.test_reasoner_rules import demo_topology, evidence

    model_server.reset()
    model_server.script(MALFORMED, MALFORMED)
    reasoner = LLMReasoner(base_url=model_server.base_url, model="tokens-bad", timeout=5, max_retries=0)
    with pytest.raises(ReasoningFailed) as failed:
        reasoner.diagnose(evidence(demo_topology()))
    usage = failed.value.usage
    assert usage.prompt_tokens > 0
    assert value("flotilla_llm_tokens_total", model="tokens-bad", kind="prompt") == usage.prompt_tokens
    assert value("flotilla_llm_tokens_total", model="tokens-bad", kind="completion") == usage.completion_tokens


# ------------------------------------------------------ labels from incoming data


def test_a_bounded_label_passes_known_values_admits_a_few_more_and_folds_the_rest() -> None:
    label = metrics.BoundedLabel(("incidents", "commands"), spare=2)
    assert [label(v) for v in ("incidents", "commands", "a", "b", "a", "c", "incidents")] == [
        "incidents",
        "commands",
        "a",
        "b",
        "a",
        "other",
        "incidents",
    ]
    assert metrics.BoundedLabel(spare=5, max_length=8)("x" * 9) == "other"  # a long value costs a slot of none
    assert metrics.BoundedLabel(("incidents",))("commands") == "other"  # no spare: known values only


def test_a_bounded_label_admits_no_more_than_its_spare_under_concurrency() -> None:
    import threading

    label = metrics.BoundedLabel(spare=10)
    seen: set[str] = set()
    lock = threading.Lock()

    def flood(start: int) -> None:
        for n in range(start, start + 500):
            got = label(f"value-{n}")
            with lock:
                seen.add(got)

    threads = [threading.Thread(target=flood, args=(i * 500,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen - {"other"}) == 10 and "other" in seen
