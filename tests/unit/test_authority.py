"""Signed authority: a command runs only on the policy service's signature, a proposal is
believed only on the agent's. Every field of what is signed is attacked here, and the
signatures are checked after a real Avro round trip through the registered contracts."""

from __future__ import annotations

import io
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from flotilla import commands
from flotilla.authority import (
    COMMAND_DOMAIN,
    Grant,
    Refusal,
    Signer,
    Unauthorized,
    attest_proposal,
    authorize_command,
    verify_command,
    verify_proposal,
)
from flotilla.contracts import load_contracts
from flotilla.digest import command_digest, step_digest
from flotilla.keys import KeyMaterialError, Keyring, load_or_create, parse_public_key, public_key_text
from services.policy.testing import proposal, step

SCALE = commands.record_type("ScaleService")
NOW = datetime(2026, 12, 3, 9, 0, 0, 123000, tzinfo=UTC)
POLICY = Signer(Ed25519PrivateKey.generate())
AGENT = Signer(Ed25519PrivateKey.generate())
TRUSTED = Keyring([POLICY.public_key])
AGENTS = Keyring([AGENT.public_key])


def _schema(full_name: str, topic: str) -> Any:
    contract = next(c for c in load_contracts() if c.full_name == full_name and c.topic == topic)
    return parse_schema(contract.schema)


def _avro(full_name: str, topic: str, value: dict[str, Any]) -> dict[str, Any]:
    schema = _schema(full_name, topic)
    buf = io.BytesIO()
    schemaless_writer(buf, schema, value)
    decoded: dict[str, Any] = schemaless_reader(io.BytesIO(buf.getvalue()), schema, None)
    return decoded


def _command(**overrides: Any) -> dict[str, Any]:
    incident, proposal_id = "incident-7", str(uuid.uuid4())
    value = step("ScaleService", incident, proposal_id, issued=NOW.replace(microsecond=123000))
    value["idempotencyKey"] = commands.idempotency_key("ScaleService", value)
    value.update(overrides)
    return value


def _signed(command: dict[str, Any] | None = None, signer: Signer = POLICY, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "decision": Grant.APPROVED,
        "approved_by": "alice",
        "proposal_digest": "sha256:" + "a" * 64,
        "now": NOW,
    }
    args.update(kw)
    return authorize_command(signer, SCALE, command or _command(), **args)


def test_a_signed_command_verifies_after_an_avro_round_trip() -> None:
    decoded = _avro(SCALE, "commands", _signed())
    verified = verify_command(TRUSTED, SCALE, decoded)
    assert (verified.decision, verified.approved_by, verified.key_id) == (Grant.APPROVED, "alice", POLICY.key_id)


def test_an_unsigned_command_is_refused() -> None:
    for value in (_command(), {**_command(), "authorization": None}, _avro(SCALE, "commands", _command())):
        with pytest.raises(Unauthorized) as refused:
            verify_command(TRUSTED, SCALE, value)
        assert refused.value.refusal is Refusal.UNSIGNED


def test_a_command_signed_by_a_key_nobody_trusts_is_refused_naming_the_key() -> None:
    rogue = Signer(Ed25519PrivateKey.generate())
    with pytest.raises(Unauthorized, match=rogue.key_id) as refused:
        verify_command(TRUSTED, SCALE, _signed(signer=rogue))
    assert refused.value.refusal is Refusal.UNKNOWN_KEY


def test_a_rogue_signature_under_the_trusted_key_id_is_refused() -> None:
    rogue = Signer(Ed25519PrivateKey.generate())
    forged = _signed(signer=rogue)
    forged["authorization"] = {**forged["authorization"], "keyId": POLICY.key_id}
    with pytest.raises(Unauthorized) as refused:
        verify_command(TRUSTED, SCALE, forged)
    assert refused.value.refusal is Refusal.BAD_SIGNATURE


TAMPERS: dict[str, Any] = {
    "replicas": lambda v: {**v, "replicas": 99},
    "target name": lambda v: {**v, "target": {**v["target"], "name": "payments-db"}},
    "environment": lambda v: {**v, "target": {**v["target"], "environment": "dev"}},
    "idempotency key": lambda v: {**v, "idempotencyKey": v["idempotencyKey"] + "x"},
    "command id": lambda v: {**v, "commandId": str(uuid.uuid4())},
    "incident": lambda v: {**v, "incidentId": "incident-8"},
    "proposal": lambda v: {**v, "proposalId": str(uuid.uuid4())},
    "expiry": lambda v: {**v, "expiresAt": v["expiresAt"] + timedelta(hours=1)},
    "issued at": lambda v: {**v, "issuedAt": v["issuedAt"] - timedelta(milliseconds=1)},
    "decision": lambda v: {**v, "authorization": {**v["authorization"], "decision": "auto"}},
    "approver": lambda v: {**v, "authorization": {**v["authorization"], "approvedBy": "mallory"}},
    "proposal digest": lambda v: {**v, "authorization": {**v["authorization"], "proposalDigest": "sha256:" + "b" * 64}},
    "signed at": lambda v: {**v, "authorization": {**v["authorization"], "signedAt": NOW + timedelta(seconds=1)}},
    "signature bit": lambda v: {
        **v,
        "authorization": {
            **v["authorization"],
            "signature": bytes([v["authorization"]["signature"][0] ^ 1]) + v["authorization"]["signature"][1:],
        },
    },
}


@pytest.mark.parametrize("what", sorted(TAMPERS))
def test_changing_anything_after_signing_is_refused(what: str) -> None:
    with pytest.raises(Unauthorized) as refused:
        verify_command(TRUSTED, SCALE, TAMPERS[what](_signed()))
    assert refused.value.refusal is Refusal.BAD_SIGNATURE, what


CHANGE = "sha256:" + "c" * 64


def test_the_change_a_person_approved_is_signed_and_survives_avro() -> None:
    decoded = _avro(SCALE, "commands", _signed(expected_change=CHANGE))
    assert decoded["authorization"]["expectedChange"] == CHANGE
    assert verify_command(TRUSTED, SCALE, decoded).expected_change == CHANGE
    for name, tampered in {
        "another change": lambda v: {
            **v,
            "authorization": {**v["authorization"], "expectedChange": "sha256:" + "d" * 64},
        },
        "the change dropped": lambda v: {**v, "authorization": {**v["authorization"], "expectedChange": None}},
    }.items():
        with pytest.raises(Unauthorized) as refused:
            verify_command(TRUSTED, SCALE, tampered(decoded))
        assert refused.value.refusal is Refusal.BAD_SIGNATURE, name


def test_a_change_cannot_be_added_to_a_command_signed_without_one() -> None:
    signed = _signed()
    added = {**signed, "authorization": {**signed["authorization"], "expectedChange": CHANGE}}
    with pytest.raises(Unauthorized) as refused:
        verify_command(TRUSTED, SCALE, added)
    assert refused.value.refusal is Refusal.BAD_SIGNATURE


def test_a_command_signed_before_expected_change_existed_still_verifies() -> None:
    """Records in flight when the field was added: signed over the fourteen claims it always
    had (built here by hand, not by the code under test), without the field in the block;
    decoded with today's schema they carry expectedChange null and must verify unchanged."""
    command = _command()
    block: dict[str, Any] = {
        "keyId": POLICY.key_id,
        "decision": "approved",
        "approvedBy": "alice",
        "proposalDigest": "sha256:" + "a" * 64,
        "signedAt": NOW,
    }
    legacy_claims = {
        "commandType": SCALE,
        "commandId": command["commandId"],
        "idempotencyKey": command["idempotencyKey"],
        "incidentId": command["incidentId"],
        "proposalId": command["proposalId"],
        "stepDigest": step_digest(command),
        "target": command["target"],
        "params": {"replicas": command["replicas"]},
        "expiresAt": command["expiresAt"],
        **block,
    }
    block["signature"] = POLICY.sign(COMMAND_DOMAIN, legacy_claims)
    old = {**command, "authorization": block}
    assert verify_command(TRUSTED, SCALE, old).expected_change is None
    decoded = _avro(SCALE, "commands", old)
    assert decoded["authorization"]["expectedChange"] is None
    verify_command(TRUSTED, SCALE, decoded)
    # and a null expectedChange signs exactly the old claims: same key, same message, same signature
    assert _signed(command)["authorization"]["signature"] == block["signature"]


def test_a_signature_for_one_kind_of_command_does_not_hold_for_another() -> None:
    signed = _signed()
    restart = commands.record_type("RestartService")
    as_restart = {**{k: v for k, v in signed.items() if k != "replicas"}, "rolling": True}
    with pytest.raises(Unauthorized):
        verify_command(TRUSTED, restart, as_restart)


def test_a_malformed_authorization_is_refused_not_crashed_on() -> None:
    for block in ({"keyId": POLICY.key_id}, {"signature": "text"}, "nonsense", {"signature": b"x" * 64}):
        with pytest.raises(Unauthorized) as refused:
            verify_command(TRUSTED, SCALE, {**_command(), "authorization": block})
        assert refused.value.refusal in (Refusal.MALFORMED, Refusal.UNKNOWN_KEY, Refusal.UNSIGNED)


def test_rotation_keeps_both_keys_trusted_until_the_old_one_is_dropped() -> None:
    new = Signer(Ed25519PrivateKey.generate())
    both = Keyring.parse([public_key_text(POLICY.public_key), public_key_text(new.public_key)])
    verify_command(both, SCALE, _signed())
    verify_command(both, SCALE, _signed(signer=new))
    with pytest.raises(Unauthorized):
        verify_command(Keyring([new.public_key]), SCALE, _signed())


def test_a_proposal_attestation_holds_only_for_what_the_agent_signed() -> None:
    value = proposal("incident-7")
    attested = attest_proposal(AGENT, value, now=NOW)
    decoded = _avro("dev.flotilla.decisions.RecoveryProposed", "incidents", {"eventId": str(uuid.uuid4()), **attested})
    assert verify_proposal(AGENTS, decoded) == AGENT.key_id
    for change in (
        {"proposedBy": "someone-else"},
        {"reasoning": {**value["reasoning"], "confidence": 0.99}},
        {"digest": command_digest([])},
        {"incidentId": "incident-8"},
    ):
        with pytest.raises(Unauthorized) as refused:
            verify_proposal(AGENTS, {**attested, **change})
        assert refused.value.refusal is Refusal.BAD_SIGNATURE, change
    with pytest.raises(Unauthorized) as unsigned:
        verify_proposal(AGENTS, value)
    assert unsigned.value.refusal is Refusal.UNSIGNED
    # a signature made for a command never passes for a proposal (the domain line differs)
    borrowed = {**attested, "attestation": {**_signed()["authorization"], "keyId": POLICY.key_id}}
    with pytest.raises(Unauthorized) as other_domain:
        verify_proposal(TRUSTED, borrowed)
    assert other_domain.value.refusal is Refusal.BAD_SIGNATURE


def test_the_digest_a_person_approves_is_the_same_before_and_after_the_command_is_signed() -> None:
    command = _command()
    assert command_digest([command]) == command_digest([_signed(command)])


def test_keys_come_from_files_and_key_texts_with_clear_errors(tmp_path: Path) -> None:
    key, created = load_or_create(tmp_path / "k" / "signing-key.pem")
    assert created and (tmp_path / "k" / "signing-key.pem").stat().st_mode & 0o777 == 0o600
    again, created_again = load_or_create(tmp_path / "k" / "signing-key.pem")
    assert not created_again and public_key_text(again.public_key()) == public_key_text(key.public_key())
    listed = tmp_path / "keys.txt"
    listed.write_text(f"# policy keys\n{public_key_text(key.public_key())}\n")
    assert len(Keyring.parse([str(listed)])) == 1
    for bad in ("ed25519:@@", "ed25519:" + "QUJD", "hello", str(tmp_path / "missing")):
        with pytest.raises(KeyMaterialError):
            Keyring.parse([bad])
    with pytest.raises(KeyMaterialError):
        parse_public_key("-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----")


def test_idempotency_keys_name_the_proposal_so_nobody_can_guess_one() -> None:
    a, b = _command(), _command()
    assert a["incidentId"] == b["incidentId"] and a["idempotencyKey"] != b["idempotencyKey"]
    assert a["idempotencyKey"] == f"incident-7:{a['proposalId']}:scale:checkout-api:12"


def test_verifiers_fail_closed_without_keys() -> None:
    from services.executor.settings import ExecutorSettings
    from services.policy.settings import PolicySettings

    with pytest.raises(ValueError, match="FLOTILLA_AUTHORIZATION_PUBLIC_KEYS"):
        ExecutorSettings(authorization_public_keys=[]).authorization_keyring()
    with pytest.raises(ValueError, match="FLOTILLA_PROPOSAL_PUBLIC_KEYS"):
        PolicySettings(proposal_public_keys=[]).proposer_keyring()
    with pytest.raises(ValueError, match="FLOTILLA_AUTHORIZATION_SIGNING_KEY_FILE"):
        PolicySettings(authorization_signing_key_file=None).authorization_signer()
