-- The policy service's own tables (idempotent). The runtime adds outbox, dedupe and
-- workflow tables next to these.

-- One row per proposal: what was proposed, what policy decided and why, and what
-- became of it. `steps` are the canonical steps (the digest's input): the commands
-- issued after an approval are rebuilt from them, and hashing them again must give
-- `digest`. The request_* columns keep the HumanApprovalRequired envelope so an
-- approval, rejection or expiry continues its causation chain, hop budget and trace.
CREATE TABLE IF NOT EXISTS policy_proposals (
    proposal_id         uuid        PRIMARY KEY,
    seq                 bigserial   NOT NULL,
    incident_id         text        NOT NULL,
    proposed_by         text        NOT NULL,
    proposal_event_id   uuid        NOT NULL,
    digest              text        NOT NULL,
    steps               jsonb       NOT NULL,
    resources           text[]      NOT NULL,
    summary             text        NOT NULL,
    facts               jsonb       NOT NULL,
    decision            text        NOT NULL CHECK (decision IN ('auto', 'human', 'deny')),
    decision_detail     jsonb       NOT NULL,
    reasons             text[]      NOT NULL,
    policy_ids          text[]      NOT NULL,
    dry_run             boolean     NOT NULL,
    status              text        NOT NULL CHECK (status IN ('authorized', 'pending', 'denied', 'dry-run',
                                        'approved', 'rejected', 'expired', 'superseded', 'cancelled',
                                        'withdrawn')),
    required_role       text        NOT NULL,
    deadline            timestamptz,
    proposed_at         timestamptz NOT NULL,
    decided_at          timestamptz NOT NULL,
    request_event_id    uuid,
    request_source      text,
    request_hops        integer,
    request_traceparent text,
    resolved_at         timestamptz,
    resolved_by         text,
    resolution          text,
    superseded_by       uuid,
    CHECK (status <> 'pending' OR (deadline IS NOT NULL AND request_event_id IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS policy_proposals_pending_deadline_idx
    ON policy_proposals (deadline) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS policy_proposals_incident_idx ON policy_proposals (incident_id, seq);

-- The current proposal per incident and resource: the newest one received. Approving
-- locks these rows and requires they still name the proposal being approved.
CREATE TABLE IF NOT EXISTS policy_current_proposals (
    incident_id text        NOT NULL,
    resource    text        NOT NULL,
    proposal_id uuid        NOT NULL,
    since       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (incident_id, resource)
);

-- 'withdrawn' (a target left the estate while a proposal waited) came after the table: a
-- database made before it gets the wider CHECK once.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
         WHERE conname = 'policy_proposals_status_check'
           AND pg_get_constraintdef(oid) LIKE '%withdrawn%'
    ) THEN
        ALTER TABLE policy_proposals DROP CONSTRAINT IF EXISTS policy_proposals_status_check;
        ALTER TABLE policy_proposals ADD CONSTRAINT policy_proposals_status_check CHECK (status IN (
            'authorized', 'pending', 'denied', 'dry-run', 'approved', 'rejected', 'expired', 'superseded',
            'cancelled', 'withdrawn'));
    END IF;
END
$$;

-- The facts this service itself verified (flotilla.provenance: its consumer loop checked
-- each producer's signature) that a proposal may rest on: an incident's opening by the
-- health agent and its diagnoses by the diagnostic agent. A proposal is decided only if
-- the diagnosis it names (by event id, under the agent's attestation) is one of them, for
-- its incident, and the incident was opened by the health agent (services/policy/basis.py).
CREATE TABLE IF NOT EXISTS policy_verified_facts (
    event_id    text        PRIMARY KEY,
    incident_id text        NOT NULL,
    record_type text        NOT NULL,
    producer    text        NOT NULL,
    digest      text        NOT NULL,
    seen_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS policy_verified_facts_incident_idx ON policy_verified_facts (incident_id);

-- The diagnosis' reasoning.reasoner, read from the verified record: the policy decides on
-- a plan knowing which reasoner made the diagnosis it rests on (a rules plan on a model's
-- diagnosis is no more trusted than the model). NULL for openings, and for diagnoses
-- remembered before this column: the policies read an unknown reasoner as untrusted.
ALTER TABLE policy_verified_facts ADD COLUMN IF NOT EXISTS reasoner text;

-- The exact change each step would make, as its target's dry run showed it when a person
-- was asked (services/policy/preview.py): a JSON list, one Change or NoPreview per step,
-- and the digest over them the approval must repeat. NULL for proposals decided before
-- these columns, or not put to a person.
ALTER TABLE policy_proposals ADD COLUMN IF NOT EXISTS changes jsonb;
ALTER TABLE policy_proposals ADD COLUMN IF NOT EXISTS change_digest text;
