"""The audit service: an append-only, hash-chained, signed log of every record on every
topic, and incident timelines built from it. See :mod:`services.audit.service`."""
