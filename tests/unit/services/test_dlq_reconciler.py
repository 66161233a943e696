"""The DLQ reconciler without the stack: reading dead letters, the quarantine fact, and
re-queue validation (schema, identity, envelope), plus operator authentication."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastavro import parse_schema
from flotilla_ops.samples import SERVICE_LATENCY_INCREASED, latency_fact

from flotilla import deadletter
from flotilla.authority import Grant, Signer, Unauthorized, attest_proposal, authorize_command, verify_proposal
from flotilla.contracts import load_contracts, subject_for
from flotilla.envelope import Envelope
from flotilla.keys import Keyring
from flotilla.rawrecords import jsonable
from flotilla.records import DeadLetterQuarantined
from flotilla.serde import AvroSerde
from flotilla.validation import RecordValidator
from services.dlq_reconciler.api import requeue_payload
from services.dlq_reconciler.auth import Operator, OperatorTokens
from services.dlq_reconciler.quarantine import (
    REQUEUED_BY,
    REQUEUED_FROM,
    UNATTRIBUTED,
    DeadLetter,
    RequeueRefused,
    fact_envelope,
    provenance,
    quarantine_fact,
    requeue_headers,
    with_identity,
)
from services.policy.testing import proposal, step
from tests.keys import producer_keys


class FakeRegistry:
    """The calls AvroSerde makes, over the repository's contracts (ids by order)."""

    def __init__(self) -> None:
        self._by_subject: dict[str, tuple[int, str]] = {}
        self._by_id: dict[int, str] = {}
        for schema_id, contract in enumerate(load_contracts(), start=1):
            self._by_subject[contract.subject] = (schema_id, contract.schema_str)
            self._by_id[schema_id] = contract.schema_str

    def get_latest_version(self, subject: str) -> Any:
        if subject not in self._by_subject:
            raise SchemaRegistryError(404, 40401, f"subject {subject} not found")
        schema_id, text = self._by_subject[subject]
        return SimpleNamespace(schema_id=schema_id, schema=Schema(text, "AVRO"))

    def lookup_schema(self, subject: str, schema: Schema, **_: Any) -> Any:
        """Look up by content (what writers ask): the contract's exact text under its subject."""
        if subject not in self._by_subject:
            raise SchemaRegistryError(404, 40401, f"subject {subject} not found")
        schema_id, text = self._by_subject[subject]
        if text != schema.schema_str:
            raise SchemaRegistryError(404, 40403, "schema not found")
        return SimpleNamespace(schema_id=schema_id, schema=schema)

    def get_schema(self, schema_id: int) -> Schema:
        if schema_id not in self._by_id:
            raise SchemaRegistryError(404, 40403, "schema not found")
        return Schema(self._by_id[schema_id], "AVRO")


@pytest.fixture(scope="module")
def serde() -> AvroSerde:
    return AvroSerde(FakeRegistry())  # type: ignore[arg-type]


def context_headers(**overrides: str) -> list[tuple[str, bytes | None]]:
    context = {
        deadletter.ORIGIN_TOPIC: "incidents",
        deadletter.ORIGIN_PARTITION: "4",
        deadletter.ORIGIN_OFFSET: "1234",
        deadletter.CONSUMER: "policy-service",
        deadletter.REASON: "invalid-record",
        deadletter.ERROR_CLASS: "BusinessRuleViolation",
        deadletter.ERROR_MESSAGE: "p95LatencyMs must not be negative",
        deadletter.FIRST_FAILURE_TIME: "2025-03-01T09:30:00.000+00:00",
        deadletter.ATTEMPTS: "1",
        **overrides,
    }
    return [(k, v.encode()) for k, v in context.items()]


def poison(serde: AvroSerde, incident: str = "incident-42", **value_overrides: Any) -> tuple[DeadLetter, Envelope]:
    value, env = latency_fact(incident)
    value.update(value_overrides)
    payload = serde.serialize("incidents", SERVICE_LATENCY_INCREASED, value)
    letter = DeadLetter(
        dlq_topic="incidents.dlq",
        dlq_partition=1,
        dlq_offset=77,
        key=incident.encode(),
        value=payload,
        headers=[*env.headers(), *context_headers()],
    )
    return letter, env


# ------------------------------------------------------------ reading letters


def test_a_dead_letter_says_where_it_came_from_and_why(serde: AvroSerde) -> None:
    letter, env = poison(serde)
    assert (letter.origin_topic, letter.origin_partition, letter.origin_offset) == ("incidents", 4, 1234)
    assert letter.consumer == "policy-service"
    assert letter.reason == "invalid-record"
    assert letter.error_class == "BusinessRuleViolation"
    assert letter.attempts == 1
    assert letter.original_event_id == env.id
    assert letter.original_type == SERVICE_LATENCY_INCREASED
    assert letter.incident_id == "incident-42"
    assert letter.envelope == env
    assert all(not name.startswith("dlq_") for name, _ in letter.original_headers)


def test_tags_route_alerts_by_reason_class_consumer_origin_and_producer(serde: AvroSerde) -> None:
    letter, _ = poison(serde)
    assert letter.tags() == {
        "reason": "invalid-record",
        "errorClass": "BusinessRuleViolation",
        "consumer": "policy-service",
        "origin": "incidents",
        "producer": "/flotilla/health-agent",
        "recordType": SERVICE_LATENCY_INCREASED,
    }


def test_a_letter_without_readable_headers_is_still_attributed_and_placed() -> None:
    letter = DeadLetter("commands.dlq", 0, 5, key=b"production/checkout-api", value=os.urandom(32), headers=[])
    assert letter.origin_topic == "commands"  # from the DLQ topic's name
    assert letter.origin_partition is None and letter.origin_offset is None
    assert letter.incident_id == UNATTRIBUTED  # a commands key is a resource, not an incident
    assert letter.envelope is None and letter.original_event_id is None
    assert letter.tags()["reason"] == "unknown"


def test_an_incidents_letter_without_correlation_falls_back_to_its_key() -> None:
    letter = DeadLetter("incidents.dlq", 0, 5, key=b"incident-9", value=b"x", headers=context_headers())
    assert letter.incident_id == "incident-9"


def test_the_quarantine_fact_matches_its_contract(serde: AvroSerde) -> None:
    letter, env = poison(serde)
    fact_env = fact_envelope(letter, "/flotilla/dlq-reconciler")
    assert fact_env is not None
    value = {"eventId": fact_env.id, **quarantine_fact(letter, uuid.uuid4(), datetime.now(UTC)).to_value()}
    schema = next(c.schema for c in load_contracts() if c.full_name == DeadLetterQuarantined.TYPE)
    assert RecordValidator(parse_schema(schema)).problems(value) == []
    assert value["originalEventId"] == env.id
    assert (value["dlqTopic"], value["dlqPartition"], value["dlqOffset"]) == ("incidents.dlq", 1, 77)
    assert value["tags"]["reason"] == "invalid-record"
    # the fact continues the dead record's chain: caused by it, one hop fewer, same trace
    assert fact_env.causationid == env.id and fact_env.correlationid == "incident-42"
    assert fact_env.hops == env.hops - 1
    assert fact_env.traceparent.split("-")[1] == env.traceparent.split("-")[1]


def test_a_fact_that_keeps_dying_cannot_feed_the_reconciler_forever(serde: AvroSerde) -> None:
    """A consumer that dead-letters DeadLetterQuarantined itself: each round costs a hop,
    and when the budget is spent the record is quarantined without a new fact."""
    letter, _ = poison(serde)
    rounds = 0
    while (fact := fact_envelope(letter, "/flotilla/dlq-reconciler")) is not None:
        rounds += 1
        letter = DeadLetter(
            "incidents.dlq", 0, rounds, letter.key, b"fact bytes", [*fact.headers(), *context_headers()]
        )
        assert rounds < 100
    assert rounds == 15  # a fresh record's 16 hops, less the one the first fact took
    assert letter.envelope is not None and letter.envelope.hops == 1


def test_the_quarantine_fact_of_an_unreadable_letter_still_matches_its_contract() -> None:
    letter = DeadLetter(
        "incidents.dlq", 2, 9, key=None, value=b"\x01junk", headers=[("ce_id", b"not-a-uuid"), *context_headers()]
    )
    value = {"eventId": str(uuid.uuid4()), **quarantine_fact(letter, uuid.uuid4(), datetime.now(UTC)).to_value()}
    schema = next(c.schema for c in load_contracts() if c.full_name == DeadLetterQuarantined.TYPE)
    assert RecordValidator(parse_schema(schema)).problems(value) == []
    assert value["originalEventId"] is None  # a non-UUID id cannot be carried in a uuid field


# --------------------------------------------------------- re-queue validation


def test_requeue_of_the_original_value_re_serializes_it(serde: AvroSerde) -> None:
    letter, env = poison(serde)
    value, payload = requeue_payload(serde, letter, None)
    assert serde.deserialize(payload).value["eventId"] == uuid.UUID(env.id)
    assert value["incidentId"] == "incident-42"


def test_a_sanitized_value_must_pass_the_registered_schema_naming_the_field(serde: AvroSerde) -> None:
    letter, _ = poison(serde)
    decoded = jsonable(serde.deserialize(letter.value).value)
    with pytest.raises(RequeueRefused) as refused:
        requeue_payload(serde, letter, {**decoded, "p95LatencyMs": "very slow"})
    assert any("'p95LatencyMs'" in p for p in refused.value.problems)
    with pytest.raises(RequeueRefused) as refused:
        requeue_payload(serde, letter, {k: v for k, v in decoded.items() if k != "service"})
    assert any("'service' is missing" in p for p in refused.value.problems)
    with pytest.raises(RequeueRefused) as refused:
        requeue_payload(serde, letter, {**decoded, "severity": "high"})
    assert any("'severity' is not in the schema" in p for p in refused.value.problems)


def test_a_sanitized_value_as_shown_by_the_api_round_trips(serde: AvroSerde) -> None:
    letter, env = poison(serde, p95LatencyMs=1800.0)
    shown = jsonable(serde.deserialize(letter.value).value)  # timestamps as epoch ms, UUIDs as text
    _, payload = requeue_payload(serde, letter, {**shown, "p95LatencyMs": 1900.0})
    decoded = serde.deserialize(payload)
    assert decoded.record_name == SERVICE_LATENCY_INCREASED
    assert decoded.value["p95LatencyMs"] == 1900.0
    assert decoded.value["eventId"] == uuid.UUID(env.id)


def test_a_sanitized_value_keeps_the_original_identity(serde: AvroSerde) -> None:
    letter, env = poison(serde)
    shown = jsonable(serde.deserialize(letter.value).value)
    without_id = {k: v for k, v in shown.items() if k != "eventId"}
    value, _ = requeue_payload(serde, letter, without_id)
    assert value["eventId"] == env.id  # filled in
    with pytest.raises(RequeueRefused, match="original identity"):
        requeue_payload(serde, letter, {**shown, "eventId": str(uuid.uuid4())})


def test_an_undecodable_original_needs_a_sanitized_value(serde: AvroSerde) -> None:
    _, env = latency_fact("incident-1")
    letter = DeadLetter("incidents.dlq", 0, 1, b"incident-1", os.urandom(40), [*env.headers(), *context_headers()])
    with pytest.raises(RequeueRefused, match="does not decode"):
        requeue_payload(serde, letter, None)


def test_a_record_without_a_valid_envelope_cannot_be_requeued(serde: AvroSerde) -> None:
    letter, _ = poison(serde)
    headerless = DeadLetter(letter.dlq_topic, 0, 1, letter.key, letter.value, context_headers())
    with pytest.raises(RequeueRefused, match="CloudEvents"):
        requeue_payload(serde, headerless, None)


def test_a_record_type_without_a_registered_schema_on_the_origin_topic_is_refused(serde: AvroSerde) -> None:
    _, env = latency_fact("incident-1")
    value, _ = latency_fact("incident-1")
    payload = serde.serialize("incidents", SERVICE_LATENCY_INCREASED, value)
    # ce_type names a record that has no subject on this topic
    bogus = Envelope(type="dev.flotilla.incidents.Nope", source="/t", correlationid="incident-1", id=env.id)
    letter = DeadLetter("incidents.dlq", 0, 1, b"k", payload, [*bogus.headers(), *context_headers()])
    with pytest.raises(RequeueRefused):
        requeue_payload(serde, letter, {"eventId": env.id})
    assert subject_for("incidents", "dev.flotilla.incidents.Nope") not in FakeRegistry()._by_subject


def test_identity_fields_are_checked_case_insensitively() -> None:
    event_id = str(uuid.uuid4())
    assert with_identity({"eventId": event_id.upper()}, {"eventId"}, event_id)["eventId"] == event_id.upper()
    assert with_identity({}, {"commandId"}, event_id) == {"commandId": event_id}
    assert with_identity({}, {"other"}, event_id) == {}


def test_requeue_headers_keep_the_original_ce_headers_and_add_provenance(serde: AvroSerde) -> None:
    letter, env = poison(serde)
    earlier = [*letter.original_headers, (REQUEUED_FROM, b"incidents.dlq/0/1"), (REQUEUED_BY, b"bob")]
    headers = requeue_headers(earlier, requeued_from=provenance("incidents.dlq", 1, 77), requeued_by="alice")
    assert headers[: len(env.headers())] == env.headers()  # ce_* byte for byte, same order
    assert [h for h in headers if h[0].startswith("dlq_")] == []
    assert [(k, v) for k, v in headers if k.startswith("flotilla_requeued")] == [
        (REQUEUED_FROM, b"incidents.dlq/1/77"),
        (REQUEUED_BY, b"alice"),
    ]


# ------------------------------------------------------------------- auth


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def test_a_bearer_token_whose_digest_is_configured_authenticates() -> None:
    tokens = OperatorTokens([digest("operator-token"), {"name": "alice", "sha256": digest("alices-token")}])
    operator = tokens.authenticate("Bearer operator-token")
    assert operator is not None and operator.name == f"operator-{digest('operator-token')[:12]}"
    alice = tokens.authenticate("bearer alices-token")
    assert alice is not None and alice.name == "alice"


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer wrong", "Basic b3BlcmF0b3ItdG9rZW4=", "operator-token"])
def test_anything_else_does_not_authenticate(header: str | None) -> None:
    assert OperatorTokens([digest("operator-token")]).authenticate(header) is None


def test_configured_tokens_must_be_digests_not_tokens() -> None:
    with pytest.raises(ValueError):
        OperatorTokens(["operator-token"])


def test_settings_read_operator_tokens_and_topics_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from services.dlq_reconciler.settings import DlqSettings

    for name in [n for n in os.environ if n.startswith("FLOTILLA_")]:  # nothing of the shell leaks in
        monkeypatch.delenv(name)

    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(tmp_path / "absent.env"))
    assert DlqSettings.load().operator_tokens is None  # not configured
    assert DlqSettings.load().dlq_topics == ("incidents.dlq", "commands.dlq")
    alice = digest("alices-token")
    monkeypatch.setenv("FLOTILLA_OPERATOR_TOKENS", f'["{digest("x")}", {{"name": "alice", "sha256": "{alice}"}}]')
    monkeypatch.setenv("FLOTILLA_DLQ_TOPICS", '["a.dlq"]')
    settings = DlqSettings.load()
    assert settings.operator_tokens == [digest("x"), {"name": "alice", "sha256": alice}]
    assert settings.dlq_topics == ("a.dlq",)
    operators, demo = settings.operators()
    assert not demo and operators.authenticate("Bearer alices-token") == Operator("alice", alice)
    assert operators.authenticate("Bearer operator-token") is None
    assert (settings.service_name, settings.service_database, settings.http_port) == (
        "dlq-reconciler",
        "flotilla_dlq",
        18107,
    )


# ------------------------------------------------------------ re-queue never mints authority

_POLICY = Signer(Ed25519PrivateKey.generate())
_SCALE = "dev.flotilla.commands.ScaleService"


def command_letter(
    serde: AvroSerde, *, signed: bool, dlq_topic: str = "commands.dlq"
) -> tuple[DeadLetter, dict[str, Any]]:
    value = step("ScaleService", "incident-7", str(uuid.uuid4()))
    if signed:
        value = authorize_command(
            _POLICY,
            _SCALE,
            value,
            decision=Grant.AUTO,
            approved_by="policy-service",
            proposal_digest="sha256:x",
            now=datetime.now(UTC),
        )
    env = Envelope(type=_SCALE, source="/flotilla/policy-service", correlationid="incident-7", id=value["commandId"])
    payload = serde.serialize("commands", _SCALE, value)
    letter = DeadLetter(dlq_topic, 0, 3, b"production/checkout-api", payload, [*env.headers(), *context_headers()])
    return letter, value


def test_an_unsigned_command_is_never_requeued(serde: AvroSerde) -> None:
    letter, _ = command_letter(serde, signed=False)
    with pytest.raises(RequeueRefused, match="unsigned"):
        requeue_payload(serde, letter, None, Keyring([_POLICY.public_key]))


def test_a_signed_command_goes_back_unchanged_only_and_only_where_policy_keys_are_known(serde: AvroSerde) -> None:
    letter, value = command_letter(serde, signed=True)
    trusted = Keyring([_POLICY.public_key])
    requeued, _ = requeue_payload(serde, letter, None, trusted)
    assert requeued["commandId"] == uuid.UUID(value["commandId"])
    shown = jsonable(serde.deserialize(letter.value).value)
    with pytest.raises(RequeueRefused, match="cannot be sanitized"):
        requeue_payload(serde, letter, {**shown, "replicas": 20}, trusted)
    with pytest.raises(RequeueRefused, match="cannot be sanitized"):
        requeue_payload(serde, letter, shown, trusted)  # even "unchanged" edits are refused
    with pytest.raises(RequeueRefused, match="no policy keys"):
        requeue_payload(serde, letter, None, Keyring([]))
    with pytest.raises(RequeueRefused, match="unknown-key"):
        requeue_payload(serde, letter, None, Keyring([Ed25519PrivateKey.generate().public_key()]))


def test_a_letter_planted_on_incidents_dlq_claiming_commands_goes_back_to_incidents(serde: AvroSerde) -> None:
    """The origin is the DLQ topic's own name; the header only shows up as a tag."""
    letter, _ = poison(serde)
    planted = DeadLetter(
        letter.dlq_topic,
        1,
        9,
        letter.key,
        letter.value,
        [*letter.original_headers, *context_headers(**{deadletter.ORIGIN_TOPIC: "commands"})],
    )
    assert planted.origin_topic == "incidents"
    assert planted.tags()["claimedOrigin"] == "commands"
    assert "claimedOrigin" not in letter.tags()


# ------------------------------------------------------------------ the profile


def _profile(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, profile: str | None, tokens: str | None) -> Any:
    from services.dlq_reconciler.settings import DlqSettings

    for name in [n for n in os.environ if n.startswith("FLOTILLA_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(tmp_path / "absent.env"))
    if profile is not None:
        monkeypatch.setenv("FLOTILLA_PROFILE", profile)
    if tokens is not None:
        monkeypatch.setenv("FLOTILLA_OPERATOR_TOKENS", tokens)
    monkeypatch.setenv("FLOTILLA_PRODUCER_KEYS", json.dumps(producer_keys()))
    return DlqSettings.load()


@pytest.mark.parametrize("tokens", [None, "", "  "])  # compose and Kubernetes pass "" for "not set"
def test_production_refuses_to_start_without_operator_tokens(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, tokens: str | None
) -> None:
    from flotilla.settings import MissingCredentials
    from services.dlq_reconciler.api import make_routes

    settings = _profile(monkeypatch, tmp_path, None, tokens)
    assert settings.profile == "production"
    with pytest.raises(MissingCredentials, match="FLOTILLA_OPERATOR_TOKENS is not set") as refused:
        make_routes(settings)  # what build_spec, and so the service's start, does
    assert "operator-token" not in str(refused.value)


@pytest.mark.parametrize("profile", ["production", "demo"])
def test_an_operator_list_that_names_nobody_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, profile: str
) -> None:
    from services.dlq_reconciler.api import make_routes

    with pytest.raises(ValueError, match="names no operator"):
        make_routes(_profile(monkeypatch, tmp_path, profile, "[]"))


@pytest.mark.parametrize("tokens", ["[not json", '"a string"', '["operator-token"]'])
def test_malformed_operator_tokens_are_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, tokens: str) -> None:
    with pytest.raises(ValueError):
        _profile(monkeypatch, tmp_path, "demo", tokens).operators()


def test_the_demo_profile_admits_the_demo_operator_token_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from services.dlq_reconciler.api import make_routes
    from services.dlq_reconciler.settings import DEMO_OPERATOR_DIGEST, DEMO_OPERATOR_TOKEN

    settings = _profile(monkeypatch, tmp_path, "demo", None)
    operators, demo = settings.operators()
    assert demo
    assert operators.authenticate(f"Bearer {DEMO_OPERATOR_TOKEN}") == Operator(
        f"operator-{DEMO_OPERATOR_DIGEST[:12]}", DEMO_OPERATOR_DIGEST
    )
    with caplog.at_level("WARNING"):
        make_routes(settings)
    assert "demo operator token" in caplog.text
    # configured tokens replace it, in the demo profile too
    operators, demo = _profile(monkeypatch, tmp_path, "demo", f'["{digest("x")}"]').operators()
    assert not demo and operators.authenticate(f"Bearer {DEMO_OPERATOR_TOKEN}") is None


# ------------------------------------------------------------ bounded metrics


def test_the_quarantine_metric_stays_bounded_whatever_the_headers_say() -> None:
    """dlq_origin_topic and dlq_error_class are written by whoever produces to a *.dlq topic:
    each distinct pair was a new series, kept forever (review M7)."""
    from prometheus_client import REGISTRY

    from services.dlq_reconciler.store import QUARANTINED, SPARE_ERROR_CLASSES, Reconciler

    reconciler = Reconciler(SimpleNamespace(), "incidents", ("incidents", "commands"))  # type: ignore[arg-type]
    before = {
        tuple(sorted(s.labels.items())) for m in REGISTRY.collect() if m.name == QUARANTINED._name for s in m.samples
    }
    for n in range(2000):
        headers = context_headers(
            **{deadletter.ORIGIN_TOPIC: f"attacker-topic-{n}", deadletter.ERROR_CLASS: f"Error{n}" + "x" * (n % 300)}
        )
        reconciler.count_quarantined(DeadLetter("incidents.dlq", 0, n, None, b"", headers))
    reconciler.count_quarantined(DeadLetter("commands.dlq", 0, 1, None, b"", context_headers()))
    after = {
        tuple(sorted(s.labels.items())) for m in REGISTRY.collect() if m.name == QUARANTINED._name for s in m.samples
    }
    added = {dict(labels)["origin_topic"] for labels in after - before}
    classes = {dict(labels)["error_class"] for labels in after - before}
    assert added <= {"incidents", "commands"}  # the origin is the DLQ topic's name: a header cannot choose it
    assert len(classes) <= SPARE_ERROR_CLASSES + 2  # the spare ones, "other", BusinessRuleViolation
    assert len(after - before) <= 2 * (SPARE_ERROR_CLASSES + 2)
    # the runtime's own error classes and the topics read are counted as they are, even after a flood
    value = REGISTRY.get_sample_value(
        "flotilla_quarantined_total", {"error_class": "BusinessRuleViolation", "origin_topic": "commands"}
    )
    assert value is not None and value >= 1


def test_a_sanitized_proposal_keeps_its_attestation_through_the_json_form(serde: AvroSerde) -> None:
    """The API shows bytes (the agent's signature) as base64; sent back, they are bytes again
    and the attestation still verifies: sanitizing restores what was signed, never mints it."""
    agent = Signer(Ed25519PrivateKey.generate())
    value = attest_proposal(agent, proposal("incident-9"), now=datetime.now(UTC))
    env = Envelope(type=RECOVERY_PROPOSED_TYPE, source="/flotilla/remediation-agent", correlationid="incident-9")
    payload = serde.serialize("incidents", RECOVERY_PROPOSED_TYPE, {"eventId": env.id, **value})
    letter = DeadLetter("incidents.dlq", 0, 5, b"incident-9", payload, [*env.headers(), *context_headers()])
    shown = jsonable(serde.deserialize(letter.value).value)
    assert isinstance(shown["attestation"]["signature"], str)
    requeued, _ = requeue_payload(serde, letter, shown)
    assert verify_proposal(Keyring([agent.public_key]), requeued) == agent.key_id
    with pytest.raises(Unauthorized):
        verify_proposal(Keyring([agent.public_key]), requeue_payload(serde, letter, {**shown, "proposedBy": "x"})[0])


RECOVERY_PROPOSED_TYPE = "dev.flotilla.decisions.RecoveryProposed"


class _FakeProducer:
    """The calls _RequeueProducer makes of confluent_kafka.Producer; delivers at once."""

    made: ClassVar[list[_FakeProducer]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.produced: list[dict[str, Any]] = []
        self._pending: list[Any] = []
        _FakeProducer.made.append(self)

    def produce(self, topic: str, **kwargs: Any) -> None:
        self.produced.append({"topic": topic, **kwargs})
        partition = kwargs.get("partition", -1)
        placed = 2 if partition == -1 else partition  # "the partitioner" of this fake: 2
        msg = SimpleNamespace(partition=lambda: placed, offset=lambda: 9)
        self._pending.append(lambda: kwargs["on_delivery"](None, msg))

    def flush(self, timeout: float = 0) -> int:
        while self._pending:
            self._pending.pop(0)()
        return 0


def test_a_requeue_goes_where_the_key_says_never_where_a_header_says(
    serde: AvroSerde, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever writes to a DLQ writes its dlq_origin_partition too: the copy is placed by
    its key (murmur2, as Debezium places the originals), whatever partition a letter claims."""
    import inspect

    from flotilla.settings import StackSettings
    from services.dlq_reconciler import api

    monkeypatch.setattr(api, "Producer", _FakeProducer)
    _FakeProducer.made.clear()
    letter, _ = poison(serde)
    forged = DeadLetter(
        dlq_topic=letter.dlq_topic,
        dlq_partition=letter.dlq_partition,
        dlq_offset=letter.dlq_offset,
        key=letter.key,
        value=letter.value,
        headers=[*letter.original_headers, *context_headers(**{deadletter.ORIGIN_PARTITION: "5"})],
    )
    assert forged.origin_partition == 5  # what the header claims: reported, not obeyed
    assert "partition" not in inspect.signature(api._RequeueProducer.send).parameters
    producer = api._RequeueProducer(StackSettings().kafka_client(), 5.0)
    headers = requeue_headers(forged.original_headers, requeued_from="incidents.dlq/1/77", requeued_by="oscar")
    delivery = producer.send(forged.origin_topic, forged.key, forged.value or b"", headers)
    assert delivery.error is None and (delivery.partition, delivery.offset) == (2, 9)
    [made] = _FakeProducer.made
    assert made.config["partitioner"] == "murmur2_random"  # the key's partition, as Debezium's
    [produced] = made.produced
    assert produced["topic"] == "incidents" and produced["key"] == forged.key
    assert produced.get("partition", -1) == -1  # -1 (or none): the partitioner decides
