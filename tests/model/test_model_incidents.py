"""Incidents decided by a real model (SmolLM2 on llama-cpp-python), and the model server
failing under them: hung, killed mid-answer, answering 429/503 or garbage.

Whatever the model answers, an incident ends one of two ways: a schema-valid decision
flows on (a production proposal then waits for a person), or the agent retries once and
escalates. Nothing that failed validation reaches a topic, and the tokens the server
reported are the ones the incident's budget counted.
"""

from __future__ import annotations

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

from .conftest import LLM_TIMEOUT_SECONDS, STACKCTL
from .tap import Exchange, ModelTap

# A decision by a small model on a loaded 2-core machine takes tens of seconds, and the
# failure tests wait out the agents' bounded waits on purpose.
pytestmark = pytest.mark.timeout(900)

DIAGNOSES = {"DependencyFailureSuspected", "DiagnosisConcluded"}
# Where an incident the model decided rests: a production plan waits for a person; an
# agent that got no valid answer escalates.
SETTLED = {"HumanApprovalRequired", "IncidentEscalated", "RecoveryRejected"}
DECIDED_IN = 300  # s: two decisions of up to two answers each, on a loaded 2-core machine


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


def model_server_pid() -> int:
    done = subprocess.run([*STACKCTL, "pid", "model-server"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip().isdigit(), done.stdout + done.stderr
    return int(done.stdout.strip())


def wait_model_server_healthy(model_server: str, timeout: float = 120) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{model_server}/v1/models", timeout=3) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the model server did not come back within {timeout:.0f}s")


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


def test_an_incident_through_the_real_model_flows_on_or_escalates_and_its_tokens_are_the_servers(
    fleet: Fleet, watch: Watch, tap: ModelTap
) -> None:
    incident = open_incident(fleet, watch)
    end = settled(watch, incident)
    watch.settle(3)
    assert tap.of(incident), "the agents never asked the model server"
    assert_nothing_invalid_reached_a_topic(watch, tap, incident)
    if end.kind == "HumanApprovalRequired":  # production: a person decides, not the model
        assert not watch.of(incident, "RecoveryApproved")
    # The budget counts what the server reported in `usage`, answer by answer (an answer
    # that came after the agent stopped waiting was never seen, so never counted).
    for member, agent in ((DIAGNOSTIC, "diagnostic"), (REMEDIATION, "remediation")):
        seen = [e for e in tap.of(incident) if e.agent == agent and e.delivered and e.seconds < LLM_TIMEOUT_SECONDS]
        assert tokens_counted(member.database or "", fleet, incident) == sum(e.tokens for e in seen), agent


def test_a_hung_model_server_costs_a_bounded_wait_then_an_escalation(
    fleet: Fleet, watch: Watch, tap: ModelTap, model_server: str
) -> None:
    pid = model_server_pid()
    os.kill(pid, signal.SIGSTOP)  # accepts connections (the kernel does), answers nothing
    try:
        incident = open_incident(fleet, watch)
        opened = time.monotonic()
        escalated = watch.kind("IncidentEscalated", incident, timeout=DECIDED_IN)
        waited = time.monotonic() - opened
    finally:
        os.kill(pid, signal.SIGCONT)
    print(f"[model] hung server: escalated {waited:.0f}s after the incident opened")
    assert "did not answer" in str(escalated.value.get("reason")), escalated.value
    assert not [s for s in watch.of(incident) if s.kind in DIAGNOSES]
    wait_model_server_healthy(model_server)


def test_a_model_server_killed_mid_answer_is_retried_or_escalated_never_stuck(
    fleet: Fleet, watch: Watch, tap: ModelTap, model_server: str
) -> None:
    incident = open_incident(fleet, watch)
    deadline = time.monotonic() + 120
    while not tap.in_flight(incident):  # the diagnostic agent is waiting for an answer
        assert time.monotonic() < deadline, "the diagnostic agent never asked the model"
        time.sleep(0.05)
    os.kill(model_server_pid(), signal.SIGKILL)  # supervisord starts it again
    settled(watch, incident)
    watch.settle(3)
    assert_nothing_invalid_reached_a_topic(watch, tap, incident)
    assert len(watch.of(incident, "IncidentEscalated")) <= 1
    wait_model_server_healthy(model_server)


@pytest.mark.parametrize("spoiled", ["429", "503", "truncated", "not-json"])
def test_a_spoiled_answer_is_asked_again_then_escalated(
    fleet: Fleet, watch: Watch, tap: ModelTap, spoiled: Any
) -> None:
    # The client asks twice (FLOTILLA_LLM_MAX_RETRIES=1): both spoiled, the decision fails.
    tap.spoil(spoiled, spoiled)
    incident = open_incident(fleet, watch)
    escalated = watch.kind("IncidentEscalated", incident, timeout=DECIDED_IN)
    watch.settle(2)
    spoilt = [e for e in tap.of(incident) if e.spoiled == spoiled]
    assert len(spoilt) == 2, {
        "this incident": [(e.status, e.spoiled) for e in tap.of(incident)],
        "spoiled": [(e.incident, e.spoiled) for e in tap.exchanges if e.spoiled],
    }
    assert "did not answer" in str(escalated.value.get("reason")), escalated.value
    assert not [s for s in watch.of(incident) if s.kind in DIAGNOSES]


def test_the_evaluation_suite_scores_the_real_model(model_server: str) -> None:
    """`flotilla eval` against the server, a bounded sample: every case is scored (the
    scores are reported, not judged: the model is tiny)."""
    env = {
        **os.environ,
        "FLOTILLA_LLM_BASE_URL": f"{model_server}/v1",
        "FLOTILLA_LLM_MODEL": "smollm2",
        "FLOTILLA_LLM_TIMEOUT_SECONDS": "120",
        "FLOTILLA_LLM_MAX_TOKENS": "384",
    }
    cases = int(os.environ.get("FLOTILLA_MODEL_EVAL_CASES", "8"))
    done = subprocess.run(
        [str(Path(sys.executable).parent / "flotilla"), "eval", "--reasoner", "llm", "--limit", str(cases), "--json"],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    sys.stdout.write(done.stderr[-3000:])
    import json

    report = json.loads(done.stdout)
    print(json.dumps(report.get("summary", report), indent=1)[:3000])
    assert len(report["cases"]) == cases
