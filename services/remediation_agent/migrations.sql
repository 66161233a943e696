-- The remediation agent's own tables (idempotent). The runtime adds outbox, processed
-- events and incident workflow.

-- Every proposal this agent made: the exact steps (canonical JSON, as digested) and why.
CREATE TABLE IF NOT EXISTS proposals (
    proposal_id        uuid             PRIMARY KEY,
    incident_id        text             NOT NULL,
    event_id           uuid             NOT NULL UNIQUE,
    diagnosis_event_id uuid             NOT NULL,
    digest             text             NOT NULL,
    steps              jsonb            NOT NULL,
    idempotency_keys   text[]           NOT NULL,
    reasoner           text             NOT NULL,
    model              text,
    confidence         double precision NOT NULL,
    prompt_tokens      bigint           NOT NULL,
    completion_tokens  bigint           NOT NULL,
    proposed_at        timestamptz      NOT NULL,
    expires_at         timestamptz      NOT NULL
);
CREATE INDEX IF NOT EXISTS proposals_incident_idx ON proposals (incident_id);
