"""The sim's action ledger: what a real target must remember to apply each action once.

- every applied action's recorded result, by idempotency key (a repeat is answered from
  it and changes nothing);
- the newest fencing token admitted per resource (an older holder is refused);
- how many requests arrived and how many applied per key: the ground truth the chaos
  soak and the storm benchmark check "exactly once" against;
- the faults raised and cleared, in order with the actions: a broken production does
  not heal because the process simulating it restarted.

In memory by default (a sim restart forgets it, as the demo wants). With a file
(``FLOTILLA_SIM_LEDGER_FILE``) every change is committed to SQLite before the sim
answers, so a SIGKILLed sim comes back remembering every key, token, count and fault,
and rebuilds its services' state by replaying faults and actions in the order they
happened (a bad deploy changes the revision a later rollback names).

SQLite because the sim is one process on one machine that must survive its own crash;
it is a stand-in for the target system's own durable store, not for a service database.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.sim.model import Fault

Fingerprint = tuple[str, str, tuple[tuple[str, str], ...]]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS applied (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    fingerprint TEXT NOT NULL,
    params TEXT NOT NULL,
    body TEXT NOT NULL,
    holder TEXT,
    fencing_token INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS newest_token (resource TEXT PRIMARY KEY, token INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS requests (idempotency_key TEXT PRIMARY KEY, count INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS fault_changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    after_applied INTEGER NOT NULL,
    change TEXT NOT NULL CHECK (change IN ('raised', 'cleared')),
    fault_id TEXT NOT NULL,
    service TEXT NOT NULL,
    kind TEXT NOT NULL,
    dependency TEXT
);
"""


@dataclass(frozen=True)
class Applied:
    """One applied action as the ledger keeps it."""

    key: str
    fingerprint: Fingerprint
    params: dict[str, Any]
    body: dict[str, Any]
    holder: str | None
    fencing_token: int

    @property
    def action(self) -> str:
        return self.fingerprint[0]

    @property
    def resource(self) -> str:
        return self.fingerprint[1]


@dataclass(frozen=True)
class FaultChange:
    """A fault raised or cleared, placed after the first ``after_applied`` applied actions
    (that position orders it among them when the history is replayed)."""

    after_applied: int
    change: str  # "raised" or "cleared"
    fault_id: str
    service: str
    kind: str
    dependency: str | None


class Ledger:
    """Applied actions, newest tokens and request counts; optionally on disk. Not
    thread-safe: :class:`~services.sim.state.SimState` calls it under its lock."""

    def __init__(self, path: Path | None = None) -> None:
        self._applied: dict[str, Applied] = {}
        self._newest: dict[str, int] = {}
        self._requests: dict[str, int] = {}
        self._fault_changes: list[FaultChange] = []
        self._db: sqlite3.Connection | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            # autocommit; FULL: a change is on disk before the sim answers the executor
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            self._load()

    def _load(self) -> None:
        assert self._db is not None
        rows = self._db.execute(
            "SELECT idempotency_key, fingerprint, params, body, holder, fencing_token FROM applied ORDER BY seq"
        )
        for key, fingerprint, params, body, holder, token in rows:
            action, resource, pairs = json.loads(fingerprint)
            self._applied[key] = Applied(
                key, (action, resource, tuple((k, v) for k, v in pairs)), json.loads(params), json.loads(body),
                holder, token,
            )  # fmt: skip
        self._newest = dict(self._db.execute("SELECT resource, token FROM newest_token").fetchall())
        self._requests = dict(self._db.execute("SELECT idempotency_key, count FROM requests").fetchall())
        self._fault_changes = [
            FaultChange(*row)
            for row in self._db.execute(
                "SELECT after_applied, change, fault_id, service, kind, dependency FROM fault_changes ORDER BY seq"
            )
        ]

    # -- reads ---------------------------------------------------------------------

    def applied(self, key: str) -> Applied | None:
        return self._applied.get(key)

    def history(self) -> Iterator[Applied | FaultChange]:
        """Every applied action and fault change, oldest first (to rebuild the services' state)."""
        changes = iter(self._fault_changes)
        pending = next(changes, None)
        for position, applied in enumerate(list(self._applied.values())):
            while pending is not None and pending.after_applied <= position:
                yield pending
                pending = next(changes, None)
            yield applied
        while pending is not None:
            yield pending
            pending = next(changes, None)

    def newest(self, resource: str) -> int | None:
        return self._newest.get(resource)

    @property
    def applications(self) -> int:
        return len(self._applied)

    def counts(self) -> dict[str, dict[str, int]]:
        """Per idempotency key: requests that arrived and times it applied (0 or 1: the
        ledger refuses to record a key twice, so 2 would be a bug in the ledger itself)."""
        return {key: {"requests": n, "applied": 1 if key in self._applied else 0} for key, n in self._requests.items()}

    # -- writes --------------------------------------------------------------------

    def count_request(self, key: str) -> None:
        self._requests[key] = self._requests.get(key, 0) + 1
        if self._db is not None:
            self._db.execute(
                "INSERT INTO requests VALUES (?, 1) ON CONFLICT (idempotency_key) DO UPDATE SET count = count + 1",
                (key,),
            )

    def admit_token(self, resource: str, token: int) -> None:
        """Raise the resource's newest admitted token to ``token`` (never lowers it)."""
        newest = max(self._newest.get(resource, token), token)
        self._newest[resource] = newest
        if self._db is not None:
            self._db.execute(
                "INSERT INTO newest_token VALUES (?, ?) ON CONFLICT (resource) DO UPDATE SET token = excluded.token",
                (resource, newest),
            )

    def record(self, applied: Applied) -> None:
        """Keep an applied action; a key already recorded is an error (sqlite3.IntegrityError
        on disk, ValueError in memory): the state machine must have answered it as a replay."""
        if applied.key in self._applied:
            raise ValueError(f"idempotency key {applied.key!r} recorded twice")
        if self._db is not None:
            action, resource, pairs = applied.fingerprint
            self._db.execute(
                "INSERT INTO applied (idempotency_key, fingerprint, params, body, holder, fencing_token)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    applied.key,
                    json.dumps([action, resource, [list(p) for p in pairs]]),
                    json.dumps(applied.params),
                    json.dumps(applied.body),
                    applied.holder,
                    applied.fencing_token,
                ),
            )
        self._applied[applied.key] = applied

    def record_fault(self, change: str, fault: Fault) -> None:
        """Keep ``fault`` raised or cleared, after every action applied so far."""
        entry = FaultChange(len(self._applied), change, fault.id, fault.service, fault.kind, fault.dependency)
        if self._db is not None:
            self._db.execute(
                "INSERT INTO fault_changes (after_applied, change, fault_id, service, kind, dependency)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (entry.after_applied, change, fault.id, fault.service, fault.kind, fault.dependency),
            )
        self._fault_changes.append(entry)

    def clear(self) -> None:
        self._applied.clear()
        self._newest.clear()
        self._requests.clear()
        self._fault_changes.clear()
        if self._db is not None:
            self._db.executescript(
                "DELETE FROM applied; DELETE FROM newest_token; DELETE FROM requests; DELETE FROM fault_changes;"
            )
