"""What signed authority costs: signing a command, verifying it, the proposal's attestation,
and the producer's signature every record now carries (flotilla.provenance).

    .venv/bin/python benchmarks/authority.py [--n 20000]

Offline (no stack): the values are the catalogue's own command and proposal records after
a real Avro round trip through the registered contracts, so the verifier sees exactly what
the executor and the policy service decode. Prints µs per operation (median of five runs
of ``n``), split into its parts: building the canonical claims (digest included) and the
Ed25519 operation itself. The issue's target: verification ≤ 200 µs per command. A fact's
signature is made once per emitted record (its outbox row) and checked once per record per
consuming member (six groups read ``incidents``).
"""

from __future__ import annotations

import argparse
import io
import statistics
import timeit
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from flotilla import authority, commands
from flotilla.authority import Grant, Signer, attest_proposal, authorize_command, verify_command, verify_proposal
from flotilla.contracts import load_contracts
from flotilla.envelope import Envelope
from flotilla.keys import Keyring
from flotilla.provenance import Provenance, sign_fact
from services.policy.testing import proposal, step

SCALE = commands.record_type("ScaleService")
PROPOSED = "dev.flotilla.decisions.RecoveryProposed"
LATENCY = "dev.flotilla.incidents.ServiceLatencyIncreased"


def round_trip(full_name: str, topic: str, value: dict[str, Any]) -> dict[str, Any]:
    schema = parse_schema(next(c.schema for c in load_contracts() if c.full_name == full_name and c.topic == topic))
    buf = io.BytesIO()
    schemaless_writer(buf, schema, value)
    decoded = schemaless_reader(io.BytesIO(buf.getvalue()), schema, None)
    assert isinstance(decoded, dict)
    return decoded


def per_call_us(fn: Callable[[], object], n: int) -> float:
    fn()
    return statistics.median(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    n = parser.parse_args().n

    policy = Signer(Ed25519PrivateKey.generate())
    agent = Signer(Ed25519PrivateKey.generate())
    # a keyring of three, as during a rotation: the lookup is by key id
    keyring = Keyring([policy.public_key, *(Ed25519PrivateKey.generate().public_key() for _ in range(2))])
    agents = Keyring([agent.public_key])
    now = datetime.now(UTC)

    command = step("ScaleService", "incident-7", str(uuid.uuid4()))
    command["idempotencyKey"] = commands.idempotency_key("ScaleService", command)

    def sign() -> dict[str, Any]:
        return authorize_command(
            policy, SCALE, command, decision=Grant.APPROVED, approved_by="alice", proposal_digest="sha256:x", now=now
        )

    signed = round_trip(SCALE, "commands", sign())
    block = signed["authorization"]
    claims = authority._command_claims(SCALE, signed, block)
    message = authority._message(authority.COMMAND_DOMAIN, claims)

    plan = attest_proposal(agent, proposal("incident-7"), now=now)
    attested = round_trip(PROPOSED, "incidents", {"eventId": str(uuid.uuid4()), **plan})

    health = Signer(Ed25519PrivateKey.generate())
    producers = Provenance({"health-agent": Keyring([health.public_key])})
    fact = Envelope(type=LATENCY, source="/flotilla/health-agent", correlationid="incident-7", causationid="c")
    payload = b"\x00\x00\x00\x00\x07" + bytes(range(256)) * 2  # a ~500-byte record, as the fleet's are
    signature = sign_fact(health, fact, payload)

    rows = [
        ("sign a command (policy service)", per_call_us(sign, n)),
        ("verify a command (executor), all of it", per_call_us(lambda: verify_command(keyring, SCALE, signed), n)),
        (
            "  of which: canonical claims + digest",
            per_call_us(lambda: authority._command_claims(SCALE, signed, block), n),
        ),
        ("  of which: Ed25519 verify", per_call_us(lambda: policy.public_key.verify(block["signature"], message), n)),
        ("attest a proposal (remediation agent)", per_call_us(lambda: attest_proposal(agent, plan, now=now), n)),
        ("verify a proposal (policy service)", per_call_us(lambda: verify_proposal(agents, attested), n)),
        ("sign a fact (any producer, per outbox row)", per_call_us(lambda: sign_fact(health, fact, payload), n)),
        (
            "verify a fact (every consumer, per record)",
            per_call_us(lambda: producers.verify(fact, payload, signature), n),
        ),
    ]
    print(f"signed authority, {n} calls x 5 runs, median (target: verify a command <= 200 µs)")
    for label, us in rows:
        print(f"  {label:<42} {us:7.1f} µs")


if __name__ == "__main__":
    main()
