"""The sim's production: services, their topology, faults, and a latency model.

Pure and deterministic: no clock, no randomness, no locking (``services.sim.state``
does that). The same topology, faults and actions always give the same p95, so a test
or a demo can assert exact numbers.

How a service's p95 is made (milliseconds)::

    own          = base latency (x BAD_DEPLOY_FACTOR while a bad revision runs)
    service time = own + p95 of each dependency's *active* target (called in turn)
    utilization  = load x service time / (replicas x pool per replica)
                   (Little's law: requests in flight over the worker slots that hold them;
                   a pool-exhausted service keeps only EXHAUSTED_POOL_FRACTION of its slots)
    penalty      = POOL_WAIT_MS x (utilization - 1) when utilization > 1, else 0
                   (requests beyond the pool wait for a slot; the wait grows with the overload)
    p95          = (service time + penalty), x SLOW_DEPENDENCY_FACTOR while the service is
                   the slow one of a dependency-slow fault

Load is fixed per service (it does not flow from callers), which keeps the numbers easy to
reason about. With the default topology, checkout-api (4 replicas, 400 rps, 20 slots per
replica, 120 ms own, payments-api 35 ms, inventory-db 25 ms) runs at 180 ms; payments-api
8x slower makes each request hold its slot for 425 ms, demand is 2.1x the 80 slots and
p95 climbs to ~1,830 ms; 12 replicas (240 slots) absorb the same demand and p95 falls to
425 ms, under the 500 ms threshold; failing payments over to its secondary gives 190 ms.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flotilla import actions

ACTIONS = tuple(spec.action for spec in actions.SPECS)  # every kind; UNMODELLED ones are refused
# rollback-forbidden is no slowness: it marks the release running when it is raised as one
# that cannot be undone (the sim's flotilla.dev/rollback-forbidden annotation), for as long
# as that release runs and the fault is not cleared.
FAULT_KINDS = ("dependency-slow", "pool-exhausted", "bad-deploy", "rollback-forbidden")
# What the sim cannot do, and why; the executor's command is refused (422), never faked.
UNMODELLED = {
    "raise-ceiling": "the sim has no autoscaler: its replicas change only by the scale action",
    "raise-memory": "the sim has no memory limits: no container of it is ever OOM-killed",
}

SLOW_DEPENDENCY_FACTOR = 8.0  # a dependency-slow service answers this many times slower
EXHAUSTED_POOL_FRACTION = 0.4  # share of its worker slots a pool-exhausted service keeps
BAD_DEPLOY_FACTOR = 4.0  # own latency of a bad revision, relative to a good one
POOL_WAIT_MS = 1250.0  # p95 wait for a pool slot per unit of overload (utilization - 1)
MAX_REPLICAS = 100
# Earlier revisions a service keeps to roll back to (a Deployment's revisionHistoryLimit default).
REVISION_HISTORY = 10


class UnknownResource(LookupError):
    """The named service (or fault) does not exist."""


class InvalidAction(ValueError):
    """An action, fault or parameter the model cannot accept; nothing was changed."""


@dataclass
class Service:
    name: str
    replicas: int
    base_ms: float  # own work per request at p95, dependencies excluded
    load_rps: float  # offered load, fixed
    pool_per_replica: int  # worker slots (threads / connections) per replica
    threshold_ms: float  # p95 above this is an incident
    revision: str
    previous_revision: str | None = None
    dependencies: list[str] = field(default_factory=list)
    failover_target: str | None = None  # standby callers may fail over to
    environment: str = "production"
    active: dict[str, str] = field(default_factory=dict)  # dependency -> target in use
    restarts: int = 0
    # Revisions that ran before the current one, oldest first, ``previous_revision`` last
    # (filled from it when a topology does not say): the revisions a rollback may name.
    earlier_revisions: list[str] = field(default_factory=list)
    paused: bool = False  # its rollout paused (the pause action); a rollback waits for a resume

    def images(self, revision: str) -> list[str]:
        """The "container=image" list of one revision: one container named after the
        service, its image tagged with the revision (the sim's stand-in for a pod template)."""
        return [f"{self.name}={self.name}:{revision}"]

    def deploy(self, revision: str) -> None:
        """Run ``revision``: the current one becomes the newest earlier revision (a revision
        run again leaves its earlier place, as a Deployment's ReplicaSet is renumbered)."""
        if revision == self.revision:
            return
        earlier = [r for r in self.earlier_revisions if r != revision] + [self.revision]
        self.earlier_revisions = earlier[-REVISION_HISTORY:]
        self.revision, self.previous_revision = revision, self.earlier_revisions[-1]


@dataclass(frozen=True)
class Fault:
    id: str
    service: str  # the service the fault was raised on
    kind: str
    dependency: str | None = None  # dependency-slow: the slow dependency of ``service``
    revision: str | None = None  # bad-deploy: the revision that is bad; rollback-forbidden: the one marked

    @property
    def slow_service(self) -> str:
        """dependency-slow: the service that answers slowly."""
        return self.dependency or self.service

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "service": self.service,
            "kind": self.kind,
            "dependency": self.dependency,
            "revision": self.revision,
        }


@dataclass(frozen=True)
class Latency:
    """How one service's p95 came about (milliseconds but utilization, demand and slots)."""

    own_ms: float
    dependencies_ms: dict[str, float]  # dependency name -> p95 of its active target
    service_time_ms: float
    utilization: float  # demand / slots, rounded
    penalty_ms: float
    p95_ms: float
    # Unrounded, for the sim's OpenTelemetry-style gauges (services/sim/telemetry.py),
    # whose ratio a Prometheus query turns back into ``utilization``.
    demand: float  # requests in flight, queued ones included: load x service time
    slots: float  # worker slots the service has now


def _ms(value: float) -> float:
    return round(value, 1)


def _touched_by(fault: Fault) -> set[str]:
    """The services a fault shows on: the one it was raised on, and its slow dependency."""
    return {fault.service} | ({fault.dependency} if fault.dependency is not None else set())


# Each action's params: (required, optional), from the kinds' one definition. A rollback's
# optional ones are the contract's nullable fields (a record older than them carries only
# toRevision, and is refused).
_PARAMS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    spec.action: (spec.required, frozenset(spec.fields) - spec.required) for spec in actions.SPECS
}


def _next_revision(revision: str) -> str:
    match = re.fullmatch(r"(.*?)(\d+)", revision)
    if match is None:
        return f"{revision}-next"
    prefix, number = match.groups()
    return f"{prefix}{int(number) + 1}"


class SimModel:
    """A topology of services plus the faults raised on it. Not thread-safe."""

    def __init__(self, services: Iterable[Service]) -> None:
        self._services: dict[str, Service] = {}
        for service in services:
            if service.name in self._services:
                raise ValueError(f"service {service.name} declared twice")
            self._services[service.name] = copy.deepcopy(service)
        self._faults: dict[str, Fault] = {}
        # Each service's faults (raised on it or naming it as the slow dependency), in the
        # order they were raised: latency() runs for every service on every scrape, and
        # scanning every fault there made a storm of K faults cost O(K) per service.
        self._faults_on: dict[str, list[Fault]] = {}
        self._fault_seq = 0
        for service in self._services.values():
            if not service.earlier_revisions and service.previous_revision is not None:
                service.earlier_revisions = [service.previous_revision]
            elif service.earlier_revisions:
                service.previous_revision = service.earlier_revisions[-1]
            for dep in service.dependencies:
                if dep not in self._services:
                    raise ValueError(f"{service.name} depends on unknown service {dep}")
                active = service.active.setdefault(dep, dep)
                if active not in (dep, self._services[dep].failover_target):
                    raise ValueError(f"{service.name} calls {active} for {dep}, which is not its failover target")
            if service.failover_target is not None and service.failover_target not in self._services:
                raise ValueError(f"{service.name} fails over to unknown service {service.failover_target}")
        for name in self._services:
            self._check_acyclic(name, ())

    @classmethod
    def default(cls) -> SimModel:
        """The demo's production: checkout-api calling payments-api and inventory-db."""
        return cls(
            [
                Service(
                    "checkout-api",
                    replicas=4,
                    base_ms=120.0,
                    load_rps=400.0,
                    pool_per_replica=20,
                    threshold_ms=500.0,
                    revision="v41",
                    previous_revision="v40",
                    dependencies=["payments-api", "inventory-db"],
                ),
                Service(
                    "payments-api",
                    replicas=3,
                    base_ms=35.0,
                    load_rps=400.0,
                    pool_per_replica=50,
                    threshold_ms=400.0,
                    revision="v17",
                    previous_revision="v16",
                    failover_target="payments-api-secondary",
                ),
                Service(
                    "payments-api-secondary",
                    replicas=2,
                    base_ms=45.0,
                    load_rps=400.0,
                    pool_per_replica=50,
                    threshold_ms=400.0,
                    revision="v17",
                    previous_revision="v16",
                ),
                Service(
                    "inventory-db",
                    replicas=2,
                    base_ms=25.0,
                    load_rps=400.0,
                    pool_per_replica=50,
                    threshold_ms=150.0,
                    revision="v8",
                    previous_revision="v7",
                ),
                Service(
                    "search-api",
                    replicas=2,
                    base_ms=60.0,
                    load_rps=150.0,
                    pool_per_replica=20,
                    threshold_ms=300.0,
                    revision="v23",
                    previous_revision="v22",
                ),
                # A development copy of the checkout path: same shape, half the load, and
                # in `dev`, where policy authorizes recoveries without a person.
                Service(
                    "checkout-dev",
                    environment="dev",
                    replicas=2,
                    base_ms=120.0,
                    load_rps=200.0,
                    pool_per_replica=20,
                    threshold_ms=500.0,
                    revision="v41",
                    previous_revision="v40",
                    dependencies=["payments-dev"],
                ),
                Service(
                    "payments-dev",
                    environment="dev",
                    replicas=2,
                    base_ms=35.0,
                    load_rps=200.0,
                    pool_per_replica=50,
                    threshold_ms=400.0,
                    revision="v17",
                    previous_revision="v16",
                ),
            ]
        )

    @classmethod
    def generated(cls, services: int, *, production_share: float = 0.25) -> SimModel:
        """A large estate for storms: ``services`` services (a multiple of 2, from 2 to
        2,000) in pairs, ``shop-NNNN`` calling ``pay-NNNN``, each pair shaped like the
        demo's checkout-dev path (a slow ``pay-NNNN`` breaches ``shop-NNNN``, and scaling
        ``shop-NNNN`` recovers it). Pairs alternate environments so that
        ``production_share`` of them are in ``production`` (a person approves there) and
        the rest in ``dev``; replicas vary from 2 to 4. Deterministic: the same arguments
        give the same estate."""
        if services % 2 or not 2 <= services <= 2000:
            raise ValueError(f"a generated estate has an even number of services from 2 to 2000, not {services}")
        if not 0.0 <= production_share <= 1.0:
            raise ValueError(f"production_share must be from 0 to 1, not {production_share}")
        pairs = services // 2
        production_every = round(1 / production_share) if production_share else 0
        estate: list[Service] = []
        for i in range(pairs):
            environment = "production" if production_every and i % production_every == 0 else "dev"
            replicas = 2 + i % 3
            estate.append(
                Service(
                    f"shop-{i:04d}",
                    environment=environment,
                    replicas=replicas,
                    base_ms=120.0,
                    load_rps=100.0 * replicas,
                    pool_per_replica=20,
                    threshold_ms=500.0,
                    revision="v41",
                    previous_revision="v40",
                    dependencies=[f"pay-{i:04d}"],
                )
            )
            estate.append(
                Service(
                    f"pay-{i:04d}",
                    environment=environment,
                    replicas=2,
                    base_ms=35.0,
                    load_rps=100.0 * replicas,
                    pool_per_replica=50,
                    threshold_ms=400.0,
                    revision="v17",
                    previous_revision="v16",
                )
            )
        return cls(estate)

    def _check_acyclic(self, name: str, path: tuple[str, ...]) -> None:
        if name in path:
            raise ValueError("dependency cycle: " + " -> ".join((*path, name)))
        for dep in self._services[name].dependencies:
            standby = self._services[dep].failover_target
            for callee in (dep, standby) if standby is not None else (dep,):
                self._check_acyclic(callee, (*path, name))

    # -- reading -------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return list(self._services)

    def service(self, name: str) -> Service:
        try:
            return self._services[name]
        except KeyError:
            raise UnknownResource(f"unknown service {name}") from None

    def resolve(self, resource: str) -> str:
        """A service name from ``name`` or ``<environment>/<name>`` (the commands-topic key)."""
        environment, _, name = resource.rpartition("/")
        service = self.service(name)
        if environment and environment != service.environment:
            raise UnknownResource(f"unknown service {resource} (it is in {service.environment})")
        return name

    @property
    def faults(self) -> list[Fault]:
        return list(self._faults.values())

    def _faults_touching(self, name: str) -> list[Fault]:
        return self._faults_on.get(name, [])

    def latency(self, name: str) -> Latency:
        service = self.service(name)
        faults = self._faults_touching(name)
        bad = any(f.kind == "bad-deploy" and f.service == name and f.revision == service.revision for f in faults)
        own = service.base_ms * (BAD_DEPLOY_FACTOR if bad else 1.0)
        deps = {dep: self.latency(service.active[dep]).p95_ms for dep in service.dependencies}
        service_time = own + sum(deps.values())
        exhausted = any(f.kind == "pool-exhausted" and f.service == name for f in faults)
        slots = service.replicas * service.pool_per_replica * (EXHAUSTED_POOL_FRACTION if exhausted else 1.0)
        demand = service.load_rps * service_time / 1000.0
        utilization = demand / slots
        penalty = POOL_WAIT_MS * max(0.0, utilization - 1.0)
        p95 = service_time + penalty
        if any(f.kind == "dependency-slow" and f.slow_service == name for f in faults):
            p95 *= SLOW_DEPENDENCY_FACTOR
        return Latency(
            own_ms=_ms(own),
            dependencies_ms=deps,
            service_time_ms=_ms(service_time),
            utilization=round(utilization, 4),
            penalty_ms=_ms(penalty),
            p95_ms=_ms(p95),
            demand=demand,
            slots=slots,
        )

    def p95(self, name: str) -> float:
        return self.latency(name).p95_ms

    def rollback_forbidden(self, name: str) -> str | None:
        """Why ``name``'s running release may not be rolled back (a rollback-forbidden
        fault raised while it ran, not cleared); None when it may."""
        service = self.service(name)
        for fault in self._faults_touching(name):
            if fault.kind == "rollback-forbidden" and fault.service == name and fault.revision == service.revision:
                return f"release {service.revision} of {name} is marked irreversible ({fault.id})"
        return None

    def describe(self, name: str) -> dict[str, Any]:
        """One service as ``GET /services/{name}`` shows it."""
        service = self.service(name)
        failover = {
            dep: target for dep in service.dependencies if (target := self._services[dep].failover_target) is not None
        }
        return {
            "name": service.name,
            "environment": service.environment,
            "replicas": service.replicas,
            "revision": service.revision,
            "previousRevision": service.previous_revision,
            "earlierRevisions": list(service.earlier_revisions),
            "images": service.images(service.revision),
            "paused": service.paused,
            "rollbackForbidden": self.rollback_forbidden(name),
            "dependencies": list(service.dependencies),
            "failoverTargets": failover,
            "activeDependencies": dict(service.active),
            "p95Ms": self.p95(name),
            "thresholdMs": service.threshold_ms,
            "faults": [f.as_json() for f in self._faults_touching(name)],
        }

    # -- faults --------------------------------------------------------------------

    def add_fault(self, service: str, kind: str, dependency: str | None = None) -> Fault:
        target = self.service(service)
        if kind not in FAULT_KINDS:
            raise InvalidAction(f"unknown fault kind {kind!r}; one of {', '.join(FAULT_KINDS)}")
        if dependency is not None:
            if kind != "dependency-slow":
                raise InvalidAction(f"a {kind} fault takes no dependency")
            if dependency not in target.dependencies:
                raise InvalidAction(f"{service} does not depend on {dependency}")
        revision = None
        if kind == "bad-deploy":
            # the fault is a deploy: a new (bad) revision replaces the running one
            revision = _next_revision(target.revision)
            target.deploy(revision)
        elif kind == "rollback-forbidden":
            revision = target.revision  # the mark travels with the release, as the annotation in its template
        self._fault_seq += 1
        fault = Fault(f"fault-{self._fault_seq}", service, kind, dependency, revision)
        self._faults[fault.id] = fault
        for name in _touched_by(fault):
            self._faults_on.setdefault(name, []).append(fault)
        return fault

    def remove_fault(self, fault_id: str) -> Fault:
        try:
            fault = self._faults.pop(fault_id)
        except KeyError:
            raise UnknownResource(f"unknown fault {fault_id}") from None
        for name in _touched_by(fault):
            self._faults_on[name].remove(fault)
        return fault

    # -- actions -------------------------------------------------------------------

    def validate(self, action: str, name: str, params: Mapping[str, Any], *, replaying: bool = False) -> None:
        """Raise :class:`InvalidAction` unless ``action`` with ``params`` can run on ``name``.
        ``replaying``: a ledger's recorded action, which may predate the rule that a
        rollback names the revision it rolls back from."""
        service = self.service(name)
        if action in UNMODELLED:
            raise InvalidAction(f"{action} cannot run on the sim: {UNMODELLED[action]}")
        required, optional = _PARAMS.get(action, (None, frozenset()))
        if required is None:
            raise InvalidAction(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
        if not required <= set(params) <= required | optional:
            expected = sorted(required) + [f"{p} (optional)" for p in sorted(optional)]
            raise InvalidAction(f"{action} takes params {expected}, got {sorted(params)}")
        if action == "scale":
            replicas = params["replicas"]
            if not isinstance(replicas, int) or isinstance(replicas, bool) or not 1 <= replicas <= MAX_REPLICAS:
                raise InvalidAction(f"replicas must be an integer from 1 to {MAX_REPLICAS}, got {replicas!r}")
        elif action == "restart":
            if not isinstance(params["rolling"], bool):
                raise InvalidAction(f"rolling must be true or false, got {params['rolling']!r}")
        elif action == "pause":
            if not isinstance(params["paused"], bool):
                raise InvalidAction(f"paused must be true or false, got {params['paused']!r}")
        elif action == "rollback":
            self._check_rollback(service, params, replaying=replaying)
        else:
            dep, to = params["dependency"], params["toTarget"]
            if dep not in service.dependencies:
                raise InvalidAction(f"{name} does not depend on {dep!r}")
            allowed = {dep, self._services[dep].failover_target} - {None}
            if to not in allowed:
                raise InvalidAction(f"{dep!r} can fail over only to {sorted(a for a in allowed if a)}, not {to!r}")

    def _check_rollback(self, service: Service, params: Mapping[str, Any], *, replaying: bool) -> None:
        """The Kubernetes target's refusals, in the sim's terms: the plan must name the
        revision running now, an earlier revision to return to and, as the sim has no
        pod-template hashes, none; the images it names, if any, must be those revisions'."""
        name, to, source = service.name, params["toRevision"], params.get("fromRevision")
        if not isinstance(to, str) or not to:
            raise InvalidAction(f"toRevision must be a revision name, got {to!r}")
        if source is None and not replaying:
            raise InvalidAction("a rollback must name the revision it rolls back from (fromRevision)")
        if source is not None and source != service.revision:
            raise InvalidAction(
                f"{name} runs {service.revision!r}, not {source!r}: it changed since the rollback was planned"
            )
        forbidden = self.rollback_forbidden(name)
        if forbidden is not None:
            raise InvalidAction(f"{name} may not be rolled back: {forbidden}")
        if service.paused:
            raise InvalidAction(f"{name}'s rollout is paused: resume it before rolling back")
        if to not in service.earlier_revisions:
            raise InvalidAction(
                f"{to!r} is not an earlier revision of {name} (running {service.revision!r};"
                f" earlier: {', '.join(service.earlier_revisions) or 'none'})"
            )
        for key in ("fromTemplateHash", "toTemplateHash"):
            if params.get(key) is not None:
                raise InvalidAction(f"{key} must be null: the sim's revisions have no pod-template hash")
        for key, revision in (("fromImages", service.revision), ("toImages", to)):
            images = params.get(key) or []
            if not isinstance(images, list) or (images and images != service.images(revision)):
                raise InvalidAction(
                    f"{key}: the images of {revision!r} are {service.images(revision)} (or none named), not {images!r}"
                )

    def apply(
        self, action: str, name: str, params: Mapping[str, Any], *, replaying: bool = False
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Run a validated action; return the service's state (before, after)."""
        self.validate(action, name, params, replaying=replaying)
        service = self.service(name)
        before = self._state(action, service, params)
        if action == "scale":
            service.replicas = int(params["replicas"])
        elif action == "restart":
            # none of the modelled faults lives in a process: a restart changes no latency
            service.restarts += 1
        elif action == "rollback":
            service.deploy(str(params["toRevision"]))
        elif action == "pause":
            # no rollout here runs over time: the state is kept, shown, and holds rollbacks back
            service.paused = bool(params["paused"])
        else:
            service.active[str(params["dependency"])] = str(params["toTarget"])
        return before, self._state(action, service, params)

    def _state(self, action: str, service: Service, params: Mapping[str, Any]) -> dict[str, Any]:
        state: dict[str, Any]
        if action == "scale":
            state = {"replicas": service.replicas}
        elif action == "restart":
            state = {"replicas": service.replicas, "revision": service.revision, "restarts": service.restarts}
        elif action == "rollback":
            # the contract's keys (revision, templateHash, images), and the sim's previousRevision
            state = {
                "revision": service.revision,
                "templateHash": None,
                "images": service.images(service.revision),
                "previousRevision": service.previous_revision,
            }
        elif action == "pause":
            state = {"paused": service.paused}
        else:
            dep = str(params["dependency"])
            state = {"dependency": dep, "activeTarget": service.active[dep]}
        state["p95Ms"] = self.p95(service.name)
        return state

    def copy(self) -> SimModel:
        return copy.deepcopy(self)
