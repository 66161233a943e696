"""The sim's mutable state: the model plus the action ledger, behind one lock.

The ledger (services/sim/ledger.py) lives in memory, or on disk when the sim is given a
file (a real target keeps it durably; the chaos soak kills the sim). It holds the
faults raised and cleared (a restarted sim is as broken as before), and

- the recorded result of every applied action, by idempotency key (a repeated key gets
  the recorded result back, marked ``replayed``, and changes nothing), and
- the newest fencing token admitted per resource (a lower token is refused with nothing
  applied, so a paused or partitioned executor cannot act after its lease moved on).

An action runs in two steps around its simulated duration, and both take the one lock:

1. *admit*: replay if the key is recorded; refuse a stale token; validate; then raise the
   resource's newest token to this one (a newer holder showing up while an older one's
   action is still running fences the older one out);
2. *commit*, after the simulated time: the same checks again (the key may have been
   recorded, a newer token admitted, or the service changed meanwhile), then apply to the
   model and record the result, together.

So two requests with the same key apply once whatever their timing, and an action whose
token went stale while it ran is refused rather than applied late. A replay is answered
before the token is checked: it applies nothing, and it tells a stale holder the truth
about its own key.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from services.sim.ledger import Applied, FaultChange, Fingerprint, Ledger
from services.sim.model import Fault, InvalidAction, SimModel, UnknownResource

_FOREIGN = "the file is from another estate or was edited; remove it, or start the sim on the estate it was written for"


class StaleToken(Exception):
    def __init__(self, token: int, newest: int) -> None:
        super().__init__(f"fencing token {token} is older than {newest}")
        self.token = token
        self.newest = newest


class KeyReused(Exception):
    """An idempotency key already recorded for a different action, resource or params."""


def _fingerprint(action: str, name: str, params: Mapping[str, Any]) -> Fingerprint:
    return action, name, tuple(sorted((k, repr(v)) for k, v in params.items()))


class SimState:
    """The model, the ledger and the lock that makes them change together."""

    def __init__(
        self,
        model: SimModel,
        *,
        action_seconds: float = 0.2,
        sleep: Callable[[float], None] = time.sleep,
        ledger: Ledger | None = None,
    ) -> None:
        self._initial = model.copy()
        self._model = model
        self._lock = threading.Lock()
        self._ledger = ledger or Ledger()
        self.action_seconds = action_seconds
        self._sleep = sleep
        # A ledger from before a restart: the services are where its faults and actions
        # left them, replayed in the order they happened.
        for entry in self._ledger.history():
            try:
                self._replay(entry)
            except (UnknownResource, InvalidAction) as exc:
                raise ValueError(f"the sim ledger cannot be replayed on this estate ({exc}): {_FOREIGN}") from exc

    def _replay(self, entry: Applied | FaultChange) -> None:
        if isinstance(entry, Applied):
            self._model.apply(entry.action, entry.resource, entry.params, replaying=True)
        elif entry.change == "cleared":
            self._model.remove_fault(entry.fault_id)
        else:
            fault = self._model.add_fault(entry.service, entry.kind, entry.dependency)
            if fault.id != entry.fault_id:  # the model numbers faults in order
                raise ValueError(
                    f"the sim ledger raised {entry.fault_id} where the replay numbered {fault.id}: {_FOREIGN}"
                )

    @property
    def applied(self) -> int:
        """Actions applied since start (of the ledger) or reset; replays excluded."""
        with self._lock:
            return self._ledger.applications

    # -- reads ---------------------------------------------------------------------

    def services(self, only: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Every service, or those of ``only`` the sim knows (by name or
        ``<environment>/<name>``; unknown ones are left out, each once, in the model's order)."""
        with self._lock:
            names = self._model.names if only is None else self._known(only)
            return [self._describe(name) for name in names]

    def known(self, only: Iterable[str]) -> list[str]:
        """The services of ``only`` the sim knows, as plain names in the model's order."""
        with self._lock:
            return self._known(only)

    def _known(self, only: Iterable[str]) -> list[str]:
        wanted = set()
        for resource in only:
            try:
                wanted.add(self._model.resolve(resource))
            except UnknownResource:
                continue
        return [name for name in self._model.names if name in wanted]

    def service(self, name: str) -> dict[str, Any]:
        with self._lock:
            return self._describe(self._model.resolve(name))

    def _describe(self, name: str) -> dict[str, Any]:
        """The service as the model describes it, plus the newest fencing token admitted
        for it (None before any action): which holder the target listens to now. Call
        with the lock held."""
        return {**self._model.describe(name), "newestFencingToken": self._ledger.newest(name)}

    def read(self, reader: Callable[[SimModel], Any]) -> Any:
        """Run ``reader`` on the model under the lock (a consistent snapshot)."""
        with self._lock:
            return reader(self._model)

    def faults(self) -> list[dict[str, Any]]:
        with self._lock:
            return [f.as_json() for f in self._model.faults]

    def lookup(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            record = self._ledger.applied(key)
            return dict(record.body) if record is not None else None

    def action_counts(self) -> dict[str, dict[str, int]]:
        """Per idempotency key: how many action requests arrived and how many applied."""
        with self._lock:
            return self._ledger.counts()

    def newest_token(self, resource: str) -> int | None:
        with self._lock:
            return self._ledger.newest(self._model.resolve(resource))

    # -- writes --------------------------------------------------------------------

    def add_fault(self, service: str, kind: str, dependency: str | None) -> Fault:
        with self._lock:
            fault = self._model.add_fault(self._model.resolve(service), kind, dependency)
            self._ledger.record_fault("raised", fault)
            return fault

    def remove_fault(self, fault_id: str) -> Fault:
        with self._lock:
            fault = self._model.remove_fault(fault_id)
            self._ledger.record_fault("cleared", fault)
            return fault

    def reset(self) -> None:
        """The initial topology, no faults, an empty ledger (for tests and demos)."""
        with self._lock:
            self._model = self._initial.copy()
            self._ledger.clear()

    def perform(
        self,
        action: str,
        resource: str,
        params: Mapping[str, Any],
        idempotency_key: str,
        fencing_token: int,
        holder: str | None,
    ) -> dict[str, Any]:
        """Apply an action once per key; return its result body (``replayed`` set).

        Raises :class:`StaleToken`, :class:`KeyReused`,
        :class:`~services.sim.model.UnknownResource` or
        :class:`~services.sim.model.InvalidAction`; none of them changes anything.
        """
        started = time.monotonic()
        with self._lock:
            self._ledger.count_request(idempotency_key)
            recorded = self._admit(action, resource, params, idempotency_key, fencing_token)
            if recorded is not None:
                return recorded
            name = self._model.resolve(resource)
            self._ledger.admit_token(name, fencing_token)
        self._sleep(self.action_seconds)
        with self._lock:
            recorded = self._admit(action, resource, params, idempotency_key, fencing_token)
            if recorded is not None:
                return recorded
            before, after = self._model.apply(action, name, params)
            body = {
                "idempotencyKey": idempotency_key,
                "action": action,
                "resource": resource,
                "status": "applied",
                "before": before,
                "after": after,
                "appliedAt": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "replayed": False,
                "durationMs": round((time.monotonic() - started) * 1000),
            }
            # recorded before the sim answers: a crash after this replays, never re-applies
            self._ledger.record(
                Applied(idempotency_key, _fingerprint(action, name, params), dict(params), body, holder, fencing_token)
            )
            return dict(body)

    def _admit(
        self, action: str, resource: str, params: Mapping[str, Any], key: str, token: int
    ) -> dict[str, Any] | None:
        """The recorded result (as a replay) if ``key`` was applied; raise if the action
        may not run; None if it may. Call with the lock held."""
        name = self._model.resolve(resource)
        record = self._ledger.applied(key)
        if record is not None:
            if record.fingerprint != _fingerprint(action, name, params):
                done = record.body
                raise KeyReused(
                    f"idempotency key {key!r} was already used for {done['action']} of {done['resource']}"
                    " with other parameters"
                )
            return {**record.body, "replayed": True}
        newest = self._ledger.newest(name)
        if newest is not None and token < newest:
            raise StaleToken(token, newest)
        self._model.validate(action, name, params)
        return None
