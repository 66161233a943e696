-- The diagnostic agent's own tables (idempotent). The runtime adds outbox, processed
-- events and incident workflow.

-- Slow diagnostic jobs: durable, so a job started before a restart finishes after it.
-- running -> done (a diagnosis or an escalation was emitted) | abandoned (the incident
-- moved on). The claim is UPDATE ... WHERE status = 'running' ... RETURNING inside the
-- transaction that emits the result: a job finishes exactly once.
CREATE TABLE IF NOT EXISTS diagnostic_jobs (
    job_id             uuid        PRIMARY KEY,
    incident_id        text        NOT NULL,
    service            text        NOT NULL,
    environment        text        NOT NULL,
    symptom            text        NOT NULL,
    job_kind           text        NOT NULL,
    status             text        NOT NULL DEFAULT 'running',
    due_at             timestamptz NOT NULL,
    deadline           timestamptz NOT NULL,
    attempts           integer     NOT NULL DEFAULT 0,
    last_error         text,
    -- the DiagnosisRequested that asked, and the DiagnosticJobStarted the result is caused by
    request_event_id   text        NOT NULL,
    request_hops       integer     NOT NULL,
    request_traceparent text       NOT NULL,
    cause_event_id     text        NOT NULL,
    cause_hops         integer     NOT NULL,
    cause_traceparent  text        NOT NULL,
    started_at         timestamptz NOT NULL DEFAULT now(),
    finished_at        timestamptz,
    outcome_type       text,
    outcome_event_id   text
);
CREATE INDEX IF NOT EXISTS diagnostic_jobs_due_idx ON diagnostic_jobs (due_at) WHERE status = 'running';
CREATE INDEX IF NOT EXISTS diagnostic_jobs_incident_idx ON diagnostic_jobs (incident_id);

-- Every diagnosis this agent emitted, with what it cost.
CREATE TABLE IF NOT EXISTS diagnoses (
    event_id             uuid             PRIMARY KEY,
    incident_id          text             NOT NULL,
    record_type          text             NOT NULL,
    service              text             NOT NULL,
    suspected_dependency text,
    cause_category       text,
    job_id               uuid,
    reasoner             text             NOT NULL,
    model                text,
    confidence           double precision NOT NULL,
    prompt_tokens        bigint           NOT NULL,
    completion_tokens    bigint           NOT NULL,
    created_at           timestamptz      NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS diagnoses_incident_idx ON diagnoses (incident_id);

-- What "normal" is: dependency latencies seen while the caller was healthy (EWMA), and
-- the revision each service last ran while healthy.
CREATE TABLE IF NOT EXISTS latency_baselines (
    service     text             NOT NULL,
    dependency  text             NOT NULL,
    p95_ms      double precision NOT NULL,
    samples     bigint           NOT NULL,
    updated_at  timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (service, dependency)
);
CREATE TABLE IF NOT EXISTS healthy_revisions (
    service     text        PRIMARY KEY,
    revision    text        NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
