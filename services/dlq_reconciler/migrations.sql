-- The DLQ reconciler's own tables (idempotent).

-- One entry per dead record, identified by where it came from: several consumers may
-- dead-letter the same origin record, and each letter is a sighting of one entry.
CREATE TABLE IF NOT EXISTS quarantine (
    id                 uuid        PRIMARY KEY,
    status             text        NOT NULL DEFAULT 'quarantined' CHECK (status IN ('quarantined', 'requeued')),
    origin_topic       text        NOT NULL,
    origin_partition   integer,
    origin_offset      bigint,
    dlq_topic          text        NOT NULL,
    dlq_partition      integer     NOT NULL,
    dlq_offset         bigint      NOT NULL,
    consumer           text        NOT NULL,
    reason             text        NOT NULL,
    error_class        text        NOT NULL,
    error_message      text        NOT NULL,
    first_failure_time text,
    attempts           integer,
    incident_id        text        NOT NULL,
    original_event_id  text,
    original_type      text,
    record_key         bytea,
    record_value       bytea,
    headers            jsonb       NOT NULL,  -- [[name, base64 value or null], ...] in order
    tags               jsonb       NOT NULL,
    fact_event_id      uuid,                  -- its DeadLetterQuarantined fact (none: hop budget spent)
    sightings          integer     NOT NULL DEFAULT 1,
    quarantined_at     timestamptz NOT NULL,
    requeued_at        timestamptz,
    requeued_by        text,
    requeued_partition integer,
    requeued_offset    bigint,
    requeued_sanitized boolean,
    requeued_value     jsonb
);
CREATE UNIQUE INDEX IF NOT EXISTS quarantine_origin_idx
    ON quarantine (origin_topic, origin_partition, origin_offset)
    WHERE origin_partition IS NOT NULL AND origin_offset IS NOT NULL;
CREATE INDEX IF NOT EXISTS quarantine_status_idx ON quarantine (status, quarantined_at);

-- Every dead letter read, by its own coordinates: a redelivered letter is a no-op.
CREATE TABLE IF NOT EXISTS quarantine_sightings (
    dlq_topic     text        NOT NULL,
    dlq_partition integer     NOT NULL,
    dlq_offset    bigint      NOT NULL,
    quarantine_id uuid        NOT NULL REFERENCES quarantine (id),
    consumer      text        NOT NULL,
    reason        text        NOT NULL,
    error_class   text        NOT NULL,
    seen_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (dlq_topic, dlq_partition, dlq_offset)
);
ALTER TABLE quarantine ALTER COLUMN fact_event_id DROP NOT NULL;
