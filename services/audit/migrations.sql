-- The audit service's own tables (idempotent).

-- The log: one row per Kafka record, never updated or deleted (the trigger below).
CREATE TABLE IF NOT EXISTS audit_log (
    seq                bigint      PRIMARY KEY,
    topic              text        NOT NULL,
    partition          integer     NOT NULL,
    "offset"           bigint      NOT NULL,
    record_key         bytea,
    kafka_timestamp_ms bigint,
    headers            text        NOT NULL,  -- canonical JSON, every header in order
    ce_id              text,
    ce_type            text,
    ce_source          text,
    ce_time            text,
    ce_correlationid   text,
    ce_causationid     text,
    record_type        text,
    record_value       bytea,                 -- the value exactly as it was on the topic
    value_json         text,                  -- decoded (canonical JSON) when it decoded
    decode_error       text,
    recorded_at        timestamptz NOT NULL,
    prev_hash          bytea       NOT NULL,
    entry_hash         bytea       NOT NULL,
    signature          bytea       NOT NULL,
    key_id             text        NOT NULL,
    UNIQUE (topic, partition, "offset")
);
CREATE INDEX IF NOT EXISTS audit_log_correlation_idx ON audit_log (ce_correlationid, seq);
-- An exact copy of an earlier record (an outbox row published twice: at-least-once delivery)
-- names that entry. Derived from the log, so outside the sealed content; set on insert only.
ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS redelivery_of bigint;
CREATE INDEX IF NOT EXISTS audit_log_event_idx ON audit_log (topic, ce_id);
-- Whether the record's producer signed it (flotilla.provenance, checked as every fleet
-- consumer checks it when the record is recorded): the member that signed, or why it is not
-- believed. Sealed with the entry. Both NULL: recorded before the audit checked signatures.
ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS verified_by text;
ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS unverified text;

CREATE OR REPLACE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE OR REPLACE TRIGGER audit_log_no_update_or_delete
    BEFORE UPDATE OR DELETE ON audit_log FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
CREATE OR REPLACE TRIGGER audit_log_no_truncate
    BEFORE TRUNCATE ON audit_log FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();
-- ALWAYS: also under session_replication_role = replica; re-enabled on every start.
ALTER TABLE audit_log ENABLE ALWAYS TRIGGER audit_log_no_update_or_delete;
ALTER TABLE audit_log ENABLE ALWAYS TRIGGER audit_log_no_truncate;

-- The chain head: the one row every append locks, so appends are serialized and the
-- chain stays linear across threads and replicas.
CREATE TABLE IF NOT EXISTS audit_chain_head (
    id         smallint    PRIMARY KEY CHECK (id = 1),
    seq        bigint      NOT NULL,
    hash       bytea       NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO audit_chain_head (id, seq, hash) VALUES (1, 0, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea)
    ON CONFLICT (id) DO NOTHING;

-- A projection for listing incidents (derived from the log, rebuilt from it if lost;
-- not covered by the chain).
CREATE TABLE IF NOT EXISTS audit_incidents (
    incident_id text        PRIMARY KEY,
    status      text        NOT NULL,
    first_at    timestamptz NOT NULL,
    last_at     timestamptz NOT NULL,
    entries     integer     NOT NULL,
    first_seq   bigint      NOT NULL,
    last_seq    bigint      NOT NULL
);
-- Folded from verified records only (status through the workflow, first/last from the Kafka
-- record timestamp); an incident only forged records name has no row here.
CREATE INDEX IF NOT EXISTS audit_incidents_last_at_idx ON audit_incidents (last_at DESC);
