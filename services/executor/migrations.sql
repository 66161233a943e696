-- The executor's own tables. Idempotent: applied at every start.
--
-- leases and executions are per resource (<environment>/<name>, the commands-topic key).
-- After a lease is acquired, every write to them is conditioned on its epoch
-- (... WHERE resource = %s AND epoch = %s), so an executor whose lease was taken over
-- cannot record anything. Lease rows are never deleted: the epoch only ever grows.

CREATE TABLE IF NOT EXISTS leases (
    resource    text        PRIMARY KEY,
    holder      text        NOT NULL,
    epoch       bigint      NOT NULL CHECK (epoch > 0),
    expires_at  timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS executions (
    idempotency_key text        PRIMARY KEY,
    resource        text        NOT NULL,
    epoch           bigint      NOT NULL,
    holder          text        NOT NULL,
    state           text        NOT NULL CHECK (state IN ('PENDING', 'APPLIED', 'FAILED')),
    retryable       boolean     NOT NULL DEFAULT false,
    attempts        integer     NOT NULL DEFAULT 1,
    command_id      uuid        NOT NULL,
    command_type    text        NOT NULL,
    incident_id     text        NOT NULL,
    proposal_id     uuid        NOT NULL,
    action          text        NOT NULL,
    params          jsonb       NOT NULL,
    compensates     uuid,
    result          jsonb,
    error_class     text,
    error_message   text,
    started_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
CREATE INDEX IF NOT EXISTS executions_resource_idx ON executions (resource, started_at);

-- One saga per proposal: its completed steps with their before-state, so a later
-- failure can undo them in reverse order.
CREATE TABLE IF NOT EXISTS sagas (
    proposal_id uuid        PRIMARY KEY,
    incident_id text        NOT NULL,
    status      text        NOT NULL,
    reason      text,
    opened_at   timestamptz NOT NULL DEFAULT now(),
    closed_at   timestamptz
);

CREATE TABLE IF NOT EXISTS saga_steps (
    proposal_id     uuid        NOT NULL REFERENCES sagas (proposal_id),
    seq             bigserial,
    command_id      uuid        NOT NULL,
    command_type    text        NOT NULL,
    idempotency_key text        NOT NULL,
    incident_id     text        NOT NULL,
    target          jsonb       NOT NULL,
    action          text        NOT NULL,
    params          jsonb       NOT NULL,
    before          jsonb       NOT NULL,
    after           jsonb       NOT NULL,
    executed_at     timestamptz NOT NULL DEFAULT now(),
    compensated_by  uuid,
    compensated_at  timestamptz,
    PRIMARY KEY (proposal_id, command_id)
);
