"""The DLQ reconciler: quarantines dead letters, tags and counts them, alerts with a
DeadLetterQuarantined fact, and lets an operator re-queue a sanitized record with its
original identity. See :mod:`services.dlq_reconciler.service`."""
