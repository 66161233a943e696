"""Keeping what a failed decision cost and why, in the agent's own database."""

from __future__ import annotations

from typing import Any

import psycopg

from flotilla_reasoning.base import ReasoningFailed

# In the database of every agent that decides through a reasoner (its spec's migrations):
# the rejected answer stays here, never on a topic.
MIGRATION = """
CREATE TABLE IF NOT EXISTS reasoning_failures (
    id                  bigserial   PRIMARY KEY,
    incident_id         text        NOT NULL,
    escalation_event_id uuid        NOT NULL,
    reasoner            text        NOT NULL,
    reason              text        NOT NULL,
    problems            text[]      NOT NULL,
    last_answer         text,
    attempts            integer     NOT NULL,
    prompt_tokens       bigint      NOT NULL,
    completion_tokens   bigint      NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now()
);
"""


def escalation_reason(failure: ReasoningFailed, what: str) -> str:
    """One sentence for IncidentEscalated.reason: no model output, only what went wrong."""
    return f"the {failure.reasoner} reasoner could not {what}: {failure.reason}"[:500]


def record_failure(
    conn: psycopg.Connection[Any], *, incident_id: str, escalation_event_id: str, failure: ReasoningFailed
) -> None:
    """The rejected answer and its problems stay here (table ``reasoning_failures``)."""
    conn.execute(
        """
        INSERT INTO reasoning_failures (incident_id, escalation_event_id, reasoner, reason, problems, last_answer,
            attempts, prompt_tokens, completion_tokens)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
        """,
        (
            incident_id,
            escalation_event_id,
            failure.reasoner,
            failure.reason,
            list(failure.problems),
            failure.last_answer[:20000] if failure.last_answer else None,
            failure.attempts,
            failure.usage.prompt_tokens,
            failure.usage.completion_tokens,
        ),
    )
