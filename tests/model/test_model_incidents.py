"""Incidents decided by a real model (SmolLM2 on llama-cpp-python), and the model server
failing under them: hung, killed mid-answer, answering 429/503 or garbage.

Whatever the model answers, an incident ends one of two ways: a schema-valid decision
flows on (a production proposal then waits for a person), or the agent retries once and
escalates. Nothing that failed validation reaches a topic, and the tokens the server
reported are the ones the incident's budget counted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from flotilla_reasoning.decision import DIAGNOSIS_SCHEMA, PROPOSAL_SCHEMA, parse_json_object, schema_problems

from flotilla.fleet import DIAGNOSTIC, REMEDIATION
from tests.e2e.fleet import Fleet, Seen, Watch, open_incident

from .conftest import LLM_TIMEOUT_SECONDS, ModelServer
from .tap import Exchange, ModelTap

DIAGNOSES = {"DependencyFailureSuspected", "DiagnosisConcluded"}
# Where an incident the model decided rests: a production plan waits for a person; an
# agent that got no valid answer escalates.
SETTLED = {"HumanApprovalRequired", "IncidentEscalated", "RecoveryRejected"}
# The longest an incident may take to settle, bounded by the agents' own waits: up to three
# decisions (a diagnosis, one after a job for more evidence, a plan) of two answers each,
# none longer than the agents' timeout, and a minute for the fleet's own steps.
DECIDED_IN = 6 * LLM_TIMEOUT_SECONDS + 60
# The hung server: two calls of LLM_TIMEOUT_SECONDS (and the client's back-off between them).
ESCALATED_IN = 2 * LLM_TIMEOUT_SECONDS + 60
pytestmark = pytest.mark.timeout(int(DECIDED_IN + 300))


def settled(watch: Watch, incident: str, timeout: float = DECIDED_IN) -> Seen:
    return watch.wait(
        lambda s: s.envelope.correlationid == incident and s.kind in SETTLED,
        timeout=timeout,
        what=f"one of {sorted(SETTLED)} for {incident}",
    )


def valid(exchange: Exchange, schema: dict[str, Any]) -> bool:
    """Whether the model's answer in ``exchange`` passes the schema the agent checks it against."""
    choices = (exchange.answer or {}).get("choices") or []
    if exchange.status != 200 or not choices:
        return False
    try:
        return not schema_problems(parse_json_object(choices[0]["message"]["content"]), schema)
    except Exception:
        return False


def answered(exchanges: list[Exchange], agent: str) -> list[Exchange]:
    """The agent's requests the server answered (not a refused response format, not spoiled)."""
    return [e for e in exchanges if e.agent == agent and e.status == 200 and e.spoiled is None]


def tokens_counted(member_database: str, fleet: Fleet, incident: str) -> int:
    with psycopg.connect(fleet.stack.pg_dsn(member_database)) as conn:
        row = conn.execute("SELECT tokens_used FROM incident_workflow WHERE incident_id = %s", (incident,)).fetchone()
    return int(row[0]) if row else 0


def open_one(fleet: Fleet, watch: Watch, tap: ModelTap) -> str:
    """Open the test's incident; the tap answers requests about any other from then on."""
    incident = open_incident(fleet, watch)
    tap.serve_only(incident)
    return incident


def assert_nothing_invalid_reached_a_topic(watch: Watch, tap: ModelTap, incident: str) -> None:
    """A decision on the topic only where the model gave an answer that validates; an
    escalation where it did not; and never more than two answers per decision."""
    exchanges = tap.of(incident)
    diagnostic, remediation = answered(exchanges, "diagnostic"), answered(exchanges, "remediation")
    diagnoses = [s for s in watch.of(incident) if s.kind in DIAGNOSES]
    proposals = watch.of(incident, "RecoveryProposed")
    assert len(diagnoses) <= 1 and len(proposals) <= 1, [s.kind for s in watch.of(incident)]
    if diagnoses:
        assert any(valid(e, DIAGNOSIS_SCHEMA) for e in diagnostic), "a diagnosis no valid answer supports"
        assert diagnoses[0].value["service"] == "checkout-api"
        assert 0 <= diagnoses[0].value["reasoning"]["confidence"] <= 1
    if proposals:
        assert any(valid(e, PROPOSAL_SCHEMA) for e in remediation), "a proposal no valid answer supports"
    if not diagnoses or (remediation and not proposals):
        assert watch.of(incident, "IncidentEscalated"), "no valid decision, yet no escalation"
    # one retry per decision: a diagnosis after a job for more evidence is a second decision
    decisions = 1 + len(watch.of(incident, "DiagnosticJobStarted"))
    assert len(diagnostic) <= 2 * decisions and len(remediation) <= 2, "more than one retry per decision"


def test_the_model_server_answers_only_requests_with_its_key(model_server: ModelServer) -> None:
    assert model_server.models(None) == 401
    assert model_server.models("not-" + model_server.key()) == 401
    assert model_server.models(model_server.key()) == 200


def test_an_incident_through_the_real_model_flows_on_or_escalates_and_its_tokens_are_the_servers(
    fleet: Fleet, watch: Watch, tap: ModelTap
) -> None:
    incident = open_one(fleet, watch, tap)
    end = settled(watch, incident)
    watch.settle(3)
    assert tap.of(incident), "the agents never asked the model server"
    # the server answered them: they hold its key (it refuses a request without one)
    assert any(e.status == 200 and e.forwarded for e in tap.of(incident)), [e.status for e in tap.of(incident)]
    assert_nothing_invalid_reached_a_topic(watch, tap, incident)
    if end.kind == "HumanApprovalRequired":  # production: a person decides, not the model
        assert not watch.of(incident, "RecoveryApproved")
    # The budget counts what the server reported in `usage`, answer by answer (an answer
    # that came after the agent stopped waiting was never seen, so never counted).
    for member, agent in ((DIAGNOSTIC, "diagnostic"), (REMEDIATION, "remediation")):
        seen = [e for e in tap.of(incident) if e.agent == agent and e.delivered and e.seconds < LLM_TIMEOUT_SECONDS]
        assert tokens_counted(member.database or "", fleet, incident) == sum(e.tokens for e in seen), agent


def test_a_hung_model_server_costs_a_bounded_wait_then_an_escalation(
    fleet: Fleet, watch: Watch, tap: ModelTap, model_server: ModelServer
) -> None:
    pid = model_server.pid()
    os.kill(pid, signal.SIGSTOP)  # accepts connections (the kernel does), answers nothing
    try:
        incident = open_one(fleet, watch, tap)
        opened = time.monotonic()
        escalated = watch.kind("IncidentEscalated", incident, timeout=ESCALATED_IN)
        waited = time.monotonic() - opened
    finally:
        os.kill(pid, signal.SIGCONT)
    print(f"[model] hung server: escalated {waited:.0f}s after the incident opened")
    assert "did not answer" in str(escalated.value.get("reason")), escalated.value
    assert not [s for s in watch.of(incident) if s.kind in DIAGNOSES]
    # it waited out the timeout (twice: the client asks once more), no longer
    assert LLM_TIMEOUT_SECONDS <= waited <= ESCALATED_IN, waited
    model_server.wait_healthy()


def test_a_model_server_killed_mid_answer_is_retried_or_escalated_never_stuck(
    fleet: Fleet, watch: Watch, tap: ModelTap, model_server: ModelServer
) -> None:
    incident = open_one(fleet, watch, tap)
    deadline = time.monotonic() + 120
    while not tap.in_flight(incident):  # the diagnostic agent is waiting for an answer
        assert time.monotonic() < deadline, "the diagnostic agent never asked the model"
        time.sleep(0.05)
    os.kill(model_server.pid(), signal.SIGKILL)  # supervisord starts it again
    settled(watch, incident)
    watch.settle(3)
    assert_nothing_invalid_reached_a_topic(watch, tap, incident)
    assert len(watch.of(incident, "IncidentEscalated")) <= 1
    model_server.wait_healthy()


@pytest.mark.parametrize("spoiled", ["429", "503", "truncated", "not-json"])
def test_a_spoiled_answer_is_asked_again_then_escalated(
    fleet: Fleet, watch: Watch, tap: ModelTap, spoiled: Any
) -> None:
    # The client asks twice (FLOTILLA_LLM_MAX_RETRIES=1): both spoiled, the decision fails.
    # The tap gives both answers itself: this is about the fleet, not about the model.
    tap.spoil(spoiled, spoiled)
    incident = open_one(fleet, watch, tap)
    escalated = watch.kind("IncidentEscalated", incident, timeout=ESCALATED_IN)
    watch.settle(2)
    spoilt = [e for e in tap.of(incident) if e.spoiled == spoiled]
    assert len(spoilt) == 2, {
        "this incident": [(e.status, e.spoiled) for e in tap.of(incident)],
        "spoiled": [(e.incident, e.spoiled) for e in tap.exchanges if e.spoiled],
    }
    assert "did not answer" in str(escalated.value.get("reason")), escalated.value
    assert not [s for s in watch.of(incident) if s.kind in DIAGNOSES]


EVAL_CASES = int(os.environ.get("FLOTILLA_MODEL_EVAL_CASES", "8"))  # at least one per kind
# each case a decision of up to two answers, each usually well under the timeout (~25-30 s a case)
EVAL_IN = EVAL_CASES * 2 * LLM_TIMEOUT_SECONDS + 60


@pytest.mark.timeout(int(EVAL_IN + 60))
def test_the_evaluation_suite_scores_the_real_model(model_server: ModelServer) -> None:
    """`flotilla eval` against the server, a bounded sample: every case is scored (the
    scores are reported, not judged: the model is tiny)."""
    env = {
        **os.environ,
        "FLOTILLA_LLM_BASE_URL": model_server.url,
        "FLOTILLA_LLM_API_KEY_FILE": str(model_server.key_file),
        "FLOTILLA_LLM_MODEL": "smollm2",
        "FLOTILLA_LLM_TIMEOUT_SECONDS": str(LLM_TIMEOUT_SECONDS),
        "FLOTILLA_LLM_MAX_TOKENS": "384",
    }
    cases = EVAL_CASES
    done = subprocess.run(
        [str(Path(sys.executable).parent / "flotilla"), "eval", "--reasoner", "llm", "--limit", str(cases), "--json"],
        capture_output=True,
        text=True,
        timeout=EVAL_IN,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    sys.stdout.write(done.stderr[-3000:])
    report = json.loads(done.stdout)
    print(json.dumps(report.get("summary", report), indent=1)[:3000])
    assert len(report["cases"]) == cases
