-- The health agent's own tables (idempotent).

-- Incident numbers: incident-<n>.
CREATE SEQUENCE IF NOT EXISTS incident_number;

-- Hysteresis state per watched service.
CREATE TABLE IF NOT EXISTS detector_state (
    environment       text             NOT NULL,
    service           text             NOT NULL,
    phase             text             NOT NULL,
    breach_streak     integer          NOT NULL,
    healthy_streak    integer          NOT NULL,
    breach_started_at timestamptz,
    open_incident     text,
    last_p95_ms       double precision,
    threshold_ms      double precision,
    last_scraped_at   timestamptz,
    PRIMARY KEY (environment, service)
);

-- Incidents this agent opened; at most one per service while its breach lasts.
CREATE TABLE IF NOT EXISTS health_incidents (
    incident_id        text             PRIMARY KEY,
    environment        text             NOT NULL,
    service            text             NOT NULL,
    p95_ms             double precision NOT NULL,
    threshold_ms       double precision NOT NULL,
    opened_at          timestamptz      NOT NULL,
    latency_event_id   uuid             NOT NULL,
    diagnosis_event_id uuid             NOT NULL,
    cleared_at         timestamptz
);
CREATE UNIQUE INDEX IF NOT EXISTS health_incidents_one_per_breach_idx
    ON health_incidents (environment, service) WHERE cleared_at IS NULL;

-- Proposals (their steps) and the steps executed, to know when a plan is done.
CREATE TABLE IF NOT EXISTS proposals (
    proposal_id uuid        PRIMARY KEY,
    incident_id text        NOT NULL,
    command_ids uuid[]      NOT NULL,
    event_id    uuid        NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS executed_steps (
    proposal_id uuid        NOT NULL,
    command_id  uuid        NOT NULL,
    incident_id text        NOT NULL,
    event_id    uuid        NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (proposal_id, command_id)
);

-- One verification window per executed proposal; decided exactly once.
CREATE TABLE IF NOT EXISTS verifications (
    proposal_id      uuid             PRIMARY KEY,
    incident_id      text             NOT NULL,
    environment      text             NOT NULL,
    service          text             NOT NULL,
    started_at       timestamptz      NOT NULL,
    window_seconds   double precision NOT NULL,
    cause            jsonb            NOT NULL,  -- envelope of the last RecoveryExecuted
    run_started_at   timestamptz,
    run_max_p95_ms   double precision,
    last_sample_at   timestamptz,
    outcome          text CHECK (outcome IN ('completed', 'failed', 'unverifiable')),
    outcome_reason   text,
    outcome_event_id uuid,
    decided_at       timestamptz
);
CREATE INDEX IF NOT EXISTS verifications_open_idx ON verifications (started_at) WHERE outcome IS NULL;
-- The agent's first look at the window (a tick that folded it, with or without a sample):
-- a window opened while a long tick ran is given its time from then, not from its start.
ALTER TABLE verifications ADD COLUMN IF NOT EXISTS watched_from timestamptz;

-- What opened an incident, and what kind of signal: the agent's own reading of latency
-- ('metrics', signal 'latency') or an Alertmanager alert ('alert', its signal).
ALTER TABLE health_incidents ADD COLUMN IF NOT EXISTS opened_by text NOT NULL DEFAULT 'metrics';
ALTER TABLE health_incidents ADD COLUMN IF NOT EXISTS signal text NOT NULL DEFAULT 'latency';
-- An incident opened by an alert has no measured p95 (the alert says what it says).
ALTER TABLE health_incidents ALTER COLUMN p95_ms DROP NOT NULL;
ALTER TABLE health_incidents ALTER COLUMN threshold_ms DROP NOT NULL;

-- Every alert Alertmanager delivered, once per firing (its fingerprint and startsAt:
-- Alertmanager resends each repeat_interval, after a restart, and from each replica of an
-- HA pair; one alert is one row however often it comes). `outcome` says what became of
-- it: opened an incident, joined the open one, recorded (nothing to open or join), or an
-- unknown service (kept for an operator: GET /alerts?outcome=unknown-service).
CREATE TABLE IF NOT EXISTS alerts (
    fingerprint     text        NOT NULL,
    starts_at       timestamptz NOT NULL,
    alert_name      text        NOT NULL,
    environment     text,
    service         text,
    signal          text        NOT NULL,
    severity        text,
    labels          jsonb       NOT NULL,
    annotations     jsonb       NOT NULL,
    generator_url   text,
    status          text        NOT NULL CHECK (status IN ('firing', 'resolved')),
    ends_at         timestamptz,
    outcome         text        NOT NULL CHECK (outcome IN ('opened', 'joined', 'recorded', 'unknown-service')),
    incident_id     text,
    received        integer     NOT NULL DEFAULT 1,
    first_received_at timestamptz NOT NULL DEFAULT now(),
    last_received_at  timestamptz NOT NULL DEFAULT now(),
    resolved_at     timestamptz,
    PRIMARY KEY (fingerprint, starts_at)
);
CREATE INDEX IF NOT EXISTS alerts_firing_by_incident_idx ON alerts (incident_id) WHERE status = 'firing';
CREATE INDEX IF NOT EXISTS alerts_outcome_idx ON alerts (outcome, last_received_at);

-- The envelope of the record that opened the incident: what later notes about it (an
-- alert joining or resolving) are caused by, so they stay in its causation chain and trace.
ALTER TABLE health_incidents ADD COLUMN IF NOT EXISTS opening jsonb;

-- The incident cap (FLOTILLA_HEALTH_INCIDENTS_PER_HOUR, incidents.py): incidents opened per
-- service in the last hour, and the one escalated notice an hour past the cap, which is not
-- counted against it.
ALTER TABLE health_incidents ADD COLUMN IF NOT EXISTS cap_notice boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS health_incidents_recent_idx ON health_incidents (environment, service, opened_at);
