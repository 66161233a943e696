"""Signed facts (flotilla.provenance): who may state each record type, and the check every
consumer loop makes before anything acts on a record."""

from __future__ import annotations

import dataclasses

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flotilla.authority import Refusal, Signer, Unauthorized
from flotilla.envelope import Envelope
from flotilla.fleet import AGENTS, DIAGNOSTIC, EXECUTOR, HEALTH
from flotilla.keys import Keyring
from flotilla.provenance import PRODUCERS, Provenance, sign_fact
from flotilla.records import BY_TYPE, DiagnosisConcluded, IncidentEscalated, RecoveryCompleted, ServiceLatencyIncreased

PAYLOAD = b"\x00\x00\x00\x00\x07avro-body"
KEYS = {m.name: Signer(Ed25519PrivateKey.generate()) for m in AGENTS}
TRUST = Provenance({name: Keyring([signer.public_key]) for name, signer in KEYS.items()})


def envelope(record_type: str, producer: str) -> Envelope:
    return Envelope(type=record_type, source=f"/flotilla/{producer}", correlationid="incident-1", causationid="c-1")


def refusal(env: Envelope, payload: bytes, signature: str | None) -> Refusal:
    with pytest.raises(Unauthorized) as refused:
        TRUST.verify(env, payload, signature)
    return refused.value.refusal


def test_every_published_record_type_has_its_producers_and_only_fleet_members() -> None:
    published = {t for t, cls in BY_TYPE.items() if cls.TOPIC}
    assert set(PRODUCERS) == published
    members = {m.name for m in AGENTS}
    assert all(producers and producers <= members for producers in PRODUCERS.values())


def test_a_fact_signed_by_its_producer_is_believed() -> None:
    env = envelope(ServiceLatencyIncreased.TYPE, HEALTH.name)
    verified = TRUST.verify(env, PAYLOAD, sign_fact(KEYS[HEALTH.name], env, PAYLOAD))
    assert (verified.producer, verified.key_id) == (HEALTH.name, KEYS[HEALTH.name].key_id)


def test_an_unsigned_fact_is_refused() -> None:
    assert refusal(envelope(ServiceLatencyIncreased.TYPE, HEALTH.name), PAYLOAD, None) is Refusal.UNSIGNED


def test_a_diagnosis_stated_by_anyone_but_the_diagnostic_agent_is_refused_even_signed() -> None:
    # The forger holds the executor's key and says so: the executor may not diagnose.
    env = envelope(DiagnosisConcluded.TYPE, EXECUTOR.name)
    assert refusal(env, PAYLOAD, sign_fact(KEYS[EXECUTOR.name], env, PAYLOAD)) is Refusal.WRONG_PRODUCER


def test_another_members_key_cannot_sign_in_a_producers_name() -> None:
    # It claims to come from the diagnostic agent, but signs with the executor's key.
    env = envelope(DiagnosisConcluded.TYPE, DIAGNOSTIC.name)
    assert refusal(env, PAYLOAD, sign_fact(KEYS[EXECUTOR.name], env, PAYLOAD)) is Refusal.UNKNOWN_KEY


def test_a_changed_payload_or_identity_voids_the_signature() -> None:
    env = envelope(RecoveryCompleted.TYPE, HEALTH.name)
    signature = sign_fact(KEYS[HEALTH.name], env, PAYLOAD)
    assert refusal(env, PAYLOAD + b"!", signature) is Refusal.BAD_SIGNATURE
    assert refusal(dataclasses.replace(env, correlationid="incident-2"), PAYLOAD, signature) is Refusal.BAD_SIGNATURE
    assert refusal(dataclasses.replace(env, causationid=None), PAYLOAD, signature) is Refusal.BAD_SIGNATURE


def test_a_signature_cannot_be_moved_to_another_record_type() -> None:
    opened = envelope(ServiceLatencyIncreased.TYPE, HEALTH.name)
    signature = sign_fact(KEYS[HEALTH.name], opened, PAYLOAD)
    verified = dataclasses.replace(opened, type=RecoveryCompleted.TYPE)
    assert refusal(verified, PAYLOAD, signature) is Refusal.BAD_SIGNATURE


@pytest.mark.parametrize("garbage", ["", "v1:abc", "v1:kid:not base64!", "v2:kid:AAAA", "x" * 500])
def test_a_garbled_signature_is_malformed_or_unknown_never_believed(garbage: str) -> None:
    env = envelope(ServiceLatencyIncreased.TYPE, HEALTH.name)
    assert refusal(env, PAYLOAD, garbage) in {Refusal.MALFORMED, Refusal.UNKNOWN_KEY, Refusal.BAD_SIGNATURE}


def test_runtime_reports_come_from_any_member_that_runs_a_loop_each_with_its_own_key() -> None:
    for member in (HEALTH, DIAGNOSTIC, EXECUTOR):
        env = envelope(IncidentEscalated.TYPE, member.name)
        assert TRUST.verify(env, PAYLOAD, sign_fact(KEYS[member.name], env, PAYLOAD)).producer == member.name


def test_an_unknown_record_type_or_source_is_refused() -> None:
    env = envelope("dev.flotilla.incidents.Whatever", HEALTH.name)
    assert refusal(env, PAYLOAD, sign_fact(KEYS[HEALTH.name], env, PAYLOAD)) is Refusal.WRONG_PRODUCER
    env = Envelope(type=ServiceLatencyIncreased.TYPE, source="https://elsewhere/health-agent", correlationid="i")
    assert refusal(env, PAYLOAD, sign_fact(KEYS[HEALTH.name], env, PAYLOAD)) is Refusal.WRONG_PRODUCER


def test_a_rotated_key_is_believed_while_both_are_in_the_keyring() -> None:
    old, new = KEYS[HEALTH.name], Signer(Ed25519PrivateKey.generate())
    rotating = Provenance({HEALTH.name: Keyring([old.public_key, new.public_key])})
    env = envelope(ServiceLatencyIncreased.TYPE, HEALTH.name)
    for signer in (old, new):
        assert rotating.verify(env, PAYLOAD, sign_fact(signer, env, PAYLOAD)).key_id == signer.key_id
    rotated = Provenance({HEALTH.name: Keyring([new.public_key])})
    with pytest.raises(Unauthorized):
        rotated.verify(env, PAYLOAD, sign_fact(old, env, PAYLOAD))


def test_no_keys_is_no_trust() -> None:
    assert not Provenance.parse({})
    assert not Provenance.parse({HEALTH.name: []})
