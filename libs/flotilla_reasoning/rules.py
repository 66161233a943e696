"""The deterministic reasoner: offline, reproducible, the default.

**Diagnosis.** A dependency is suspect when the p95 the degraded service sees from it is
far above its normal — the baseline the agent learned while the caller was healthy, or,
without one, the dependency's own latency threshold — the more so the further above:
confidence is ``1 - 1/slowdown`` (8x normal → 0.875), shared when several dependencies
are slow, and lower when the service's worker pool is not waiting. Without any baseline
a dependency that takes most of the service's dependency time while the pool waits is
still suspected, with a confidence of at most 0.5. When no dependency explains the
latency, the reasoner asks for a slow diagnostic job once, then concludes: a service now
running another revision than the one it last ran healthily is a bad deployment,
otherwise it is short of capacity.

**Remediation** uses the latency model of a worker pool (Little's law): slots in use =
load × service time, and a service whose demand exceeds its slots (utilization above 1)
makes requests queue. ``ceil(replicas × utilization / target utilization)`` replicas
bring utilization back to the target (0.75 leaves a quarter of headroom). In the demo
checkout-api runs 4 replicas at utilization 2.125 while payments-api is slow:
``ceil(4 × 2.125 / 0.75) = 12``. Where the source does not report utilization, the p95
over the threshold stands in for it (cruder, and said so in the evidence).

**A plan's confidence is measured, never borrowed.** A plan made from the rules' own
diagnosis keeps that diagnosis' confidence (the diagnostic agent computed it from the
measurements, baselines included). A diagnosis from any other reasoner (a model's) is the
model's word, and text in its inputs can set it, so the plan does not take its number:
the rules read the same evidence again and the plan rests on *their* confidence in the
same conclusion (none, when their measurements do not reach it), said so in the plan's
evidence. The policy still sees that the plan rests on a model (``diagnosisReasoner``).
A service within its threshold gets no scale-out or failover: there is no shortage to
restore, whatever the diagnosis says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flotilla_reasoning.base import ReasoningFailed
from flotilla_reasoning.model import (
    Action,
    Diagnosis,
    DiagnosticEvidence,
    EvidenceItem,
    PlannedStep,
    Proposal,
    Reasoning,
    ServiceView,
    Topology,
    Verdict,
    rollback_params,
)
from flotilla_reasoning.settings import AgentSettings, Strategy

NAME = "rules"
FAILURE_MODE = "slow-responses"
PROFILE_JOB = "cpu-profile"
RECHECK_JOB = "evidence-recheck"  # the same evidence read again, later: it had not seen the breach
DOMINANT_SHARE = 0.75  # share of the dependency time that makes one dependency "the" suspect


@dataclass(frozen=True)
class RulesConfig:
    suspect_ratio: float = 2.0
    dependency_normal_ms: float = 100.0
    target_utilization: float = 0.75
    strategy: Strategy = "scale"
    max_replicas: int = 20

    @classmethod
    def from_settings(cls, settings: AgentSettings) -> RulesConfig:
        return cls(
            suspect_ratio=settings.rules_suspect_ratio,
            dependency_normal_ms=settings.rules_dependency_normal_ms,
            target_utilization=settings.rules_target_utilization,
            strategy=settings.remediation_strategy,
            max_replicas=settings.max_replicas,
        )


@dataclass(frozen=True)
class DependencyReading:
    """How slow one dependency looks from one caller, against its normal."""

    service: str
    dependency: str
    observed_ms: float
    normal_ms: float
    learned: bool  # normal is a learned baseline (else a threshold or a default)

    @property
    def slowdown(self) -> float:
        return self.observed_ms / self.normal_ms

    def evidence(self, source: str) -> EvidenceItem:
        basis = "learned baseline" if self.learned else "no baseline learned: its latency threshold or a default"
        return EvidenceItem(
            kind="dependency-health",
            source=f"{source}: p95 of {self.service} -> {self.dependency}",
            description=(
                f"{self.service} waits {self.observed_ms:.0f} ms (p95) on {self.dependency}, "
                f"{self.slowdown:.1f}x its normal {self.normal_ms:.0f} ms ({basis})"
            ),
            observed_value=f"{self.observed_ms:.0f} ms",
        )


def readings(topology: Topology, service: ServiceView, default_normal_ms: float) -> list[DependencyReading]:
    """Every dependency of ``service`` with a latency, slowest (relative to normal) first."""
    found = []
    for dependency in service.dependencies:
        observed = topology.observed_dependency_p95(service.name, dependency)
        if observed is None:
            continue
        baseline = topology.baselines.get((service.name, dependency))
        known = topology.services.get(dependency)
        if baseline is not None and baseline > 0:
            normal, learned = baseline, True
        elif known is not None and known.threshold_ms > 0:
            normal, learned = known.threshold_ms, False
        else:
            normal, learned = default_normal_ms, False
        found.append(DependencyReading(service.name, dependency, observed, normal, learned))
    return sorted(found, key=lambda r: (-r.slowdown, r.dependency))


def replicas_for(current: int, utilization: float, target_utilization: float) -> int:
    """Replicas that bring a pool at ``utilization`` (with ``current`` replicas) down to
    ``target_utilization``; rounded to 1e-6 first so that exact products stay exact."""
    return max(1, math.ceil(round(current * utilization / target_utilization, 6)))


def _service_evidence(topology: Topology, service: ServiceView) -> list[EvidenceItem]:
    found = [
        EvidenceItem(
            kind="metric",
            source=f"{topology.source}: p95 of {service.name}",
            description=(
                f"{service.name} p95 is {service.p95_ms:.0f} ms against its {service.threshold_ms:.0f} ms "
                f"threshold ({service.p95_ms / service.threshold_ms:.1f}x) with {_count(service.replicas)} replicas"
            ),
            observed_value=f"{service.p95_ms:.0f} ms",
        )
    ]
    change = _history_evidence(topology, service)
    if change is not None:
        found.append(change)
    utilization = topology.utilization.get(service.name)
    if utilization is not None:
        found.append(
            EvidenceItem(
                kind="metric",
                source=f"{topology.source}: pool utilization of {service.name}",
                description=(
                    f"worker-slot demand is {utilization:.2f}x the slots of {service.name}"
                    + ("; requests queue for the pool" if utilization > 1 else "")
                ),
                observed_value=f"{utilization:.3f}",
            )
        )
    return found


def _count(replicas: int | None) -> str:
    return "an unknown number of" if replicas is None else str(replicas)


def _history_evidence(topology: Topology, service: ServiceView) -> EvidenceItem | None:
    """Before and after, from the source's history: when the p95 first crossed the
    threshold in the look-back, and what it was before (a range query's answer)."""
    series = topology.history.get(service.name) or ()
    crossed = next((i for i, (_, v) in enumerate(series) if v > service.threshold_ms), None)
    if not series or crossed is None:
        return None
    at = series[crossed][0]
    before = [v for _, v in series[:crossed]]
    was = f"{max(before):.0f} ms at most before" if before else "over it since the look-back began"
    return EvidenceItem(
        kind="metric-history",
        source=f"{topology.source}: p95 of {service.name} over time",
        description=(
            f"{service.name} p95 crossed its {service.threshold_ms:.0f} ms threshold at {at.strftime('%H:%M:%S')} "
            f"UTC ({was}); {series[-1][1]:.0f} ms now"
        ),
        observed_value=f"{series[-1][1]:.0f} ms",
    )


def _breach_seen(topology: Topology, service: ServiceView, evidence: DiagnosticEvidence) -> bool:
    """Whether the evidence has seen the breach the incident is about: any reading of the
    service above its threshold since the diagnosis was asked for (assumed, when that
    moment is not known). A breach that came and went before the agent looked counts."""
    if evidence.requested_at is None:
        return True
    series = topology.history.get(service.name) or ()
    return any(at >= evidence.requested_at and value > service.threshold_ms for at, value in series)


def _describe(diagnosis: Diagnosis) -> str:
    """``dependency-failure(payments-api)``, ``concluded(capacity)``: a verdict and what it names."""
    detail = diagnosis.suspected_dependency or diagnosis.cause_category or diagnosis.job_kind
    return f"{diagnosis.verdict.value}({detail})" if detail else diagnosis.verdict.value


def _clamp(confidence: float) -> float:
    return round(min(max(confidence, 0.0), 0.99), 3)


class RulesReasoner:
    """Deterministic rules over one topology snapshot: same input, same decision."""

    name = NAME

    def __init__(self, config: RulesConfig | None = None) -> None:
        self.config = config or RulesConfig()

    # ------------------------------------------------------------ diagnosis

    def diagnose(self, evidence: DiagnosticEvidence) -> Diagnosis:
        topology = evidence.topology
        service = topology.services.get(evidence.service)
        if service is None:
            raise ReasoningFailed(
                f"{evidence.service} is not in the topology {evidence.topology.source} reports "
                "(no p95 or no latency threshold for it)",
                reasoner=NAME,
            )
        seen = _service_evidence(topology, service)
        if evidence.job_id is not None:
            seen.append(
                EvidenceItem(
                    kind="diagnostic-job",
                    source=f"diagnostic job {evidence.job_id}",
                    description=f"{evidence.job_kind or 'diagnostic'} job finished; the topology was read again",
                )
            )
        found = readings(topology, service, self.config.dependency_normal_ms)
        utilization = topology.utilization.get(service.name)
        pool_waits = utilization > 1.0 if utilization is not None else service.degraded
        if service.degraded:
            slow = [r for r in found if r.slowdown >= self.config.suspect_ratio]
            if slow:
                return self._suspect(evidence, service, slow[0], slow, found, pool_waits, seen)
            dominant = self._dominant(found) if pool_waits else None
            if dominant is not None:
                return self._suspect(evidence, service, dominant, [], found, pool_waits, seen)
        seen += [r.evidence(topology.source) for r in found]
        if service.degraded and evidence.may_request_more:
            summary = (
                f"No dependency of {service.name} is slower than {self.config.suspect_ratio:.1f}x its normal; "
                f"profiling {service.name} before concluding."
            )
            return self._diagnosis(evidence, Verdict.NEEDS_EVIDENCE, summary, seen, 0.0, job_kind=PROFILE_JOB)
        if not service.degraded and evidence.may_request_more and not _breach_seen(topology, service, evidence):
            # A storm's first diagnoses came back "unknown" this way, and their low-confidence
            # restarts changed nothing: the evidence was a scrape behind the detection.
            summary = (
                f"{topology.source} shows {service.name} under its threshold ({service.p95_ms:.0f} ms against "
                f"{service.threshold_ms:.0f} ms) with no reading above it since the incident asked for a "
                "diagnosis: its readings are behind the detection; reading them again before concluding."
            )
            return self._diagnosis(evidence, Verdict.NEEDS_EVIDENCE, summary, seen, 0.0, job_kind=RECHECK_JOB)
        return self._conclude(evidence, service, seen)

    @staticmethod
    def _dominant(found: list[DependencyReading]) -> DependencyReading | None:
        """Without a learned normal: the dependency that takes most of the dependency time."""
        total = sum(r.observed_ms for r in found)
        if not found or total <= 0:
            return None
        top = max(found, key=lambda r: (r.observed_ms, r.dependency))
        if top.learned or top.observed_ms / total < DOMINANT_SHARE:
            return None
        return top

    def _suspect(
        self,
        evidence: DiagnosticEvidence,
        service: ServiceView,
        top: DependencyReading,
        slow: list[DependencyReading],
        found: list[DependencyReading],
        pool_waits: bool,
        seen: list[EvidenceItem],
    ) -> Diagnosis:
        source = evidence.topology.source
        if slow:
            confidence = 1.0 - 1.0 / top.slowdown
            if len(slow) > 1:  # several suspects share the blame in proportion
                confidence *= top.slowdown / sum(r.slowdown for r in slow)
            why = f"{top.slowdown:.1f}x its normal {top.normal_ms:.0f} ms"
        else:
            share = top.observed_ms / sum(r.observed_ms for r in found)
            confidence = 0.5 * share
            why = f"{share:.0%} of {service.name}'s dependency time, with no learned normal to compare against"
        if not pool_waits:
            confidence *= 0.8  # the dependency is slow, but nothing queues behind it
        seen.append(top.evidence(source))
        seen += [r.evidence(source) for r in found if r is not top]
        summary = (
            f"{top.dependency} answers {service.name} in {top.observed_ms:.0f} ms, {why}; {service.name}'s p95 of "
            f"{service.p95_ms:.0f} ms is {service.p95_ms / service.threshold_ms:.1f}x its threshold"
            + (" because its worker pool waits on the slow calls." if pool_waits else ".")
        )
        return self._diagnosis(
            evidence,
            Verdict.DEPENDENCY_FAILURE,
            summary,
            seen,
            confidence,
            suspected_dependency=top.dependency,
            failure_mode=FAILURE_MODE,
        )

    def _conclude(self, evidence: DiagnosticEvidence, service: ServiceView, seen: list[EvidenceItem]) -> Diagnosis:
        healthy = evidence.topology.healthy_revisions.get(service.name)
        if not service.degraded:
            category, confidence = "unknown", 0.3
            summary = f"{service.name} is back under its threshold ({service.p95_ms:.0f} ms); the cause is unknown."
        elif healthy is not None and healthy != service.revision:
            category, confidence = "bad-deployment", 0.7
            summary = (
                f"No dependency explains {service.name}'s {service.p95_ms:.0f} ms p95, and it now runs revision "
                f"{service.revision} where it last ran healthy on {healthy}: the deployment is suspect."
            )
            seen.append(
                EvidenceItem(
                    kind="deployment",
                    source=f"{evidence.topology.source}: revision of {service.name}",
                    description=f"{service.name} runs {service.revision}; it last ran healthy on {healthy}",
                    observed_value=service.revision,
                )
            )
        else:
            ratio = service.p95_ms / service.threshold_ms
            category, confidence = "capacity", 0.8 * (1.0 - 1.0 / ratio)
            summary = (
                f"No dependency explains {service.name}'s {service.p95_ms:.0f} ms p95 ({ratio:.1f}x its threshold) "
                f"and its revision is unchanged: its {_count(service.replicas)} replicas are short of capacity."
            )
        return self._diagnosis(evidence, Verdict.CONCLUDED, summary, seen, confidence, cause_category=category)

    @staticmethod
    def _diagnosis(
        evidence: DiagnosticEvidence,
        verdict: Verdict,
        summary: str,
        seen: list[EvidenceItem],
        confidence: float,
        *,
        suspected_dependency: str | None = None,
        failure_mode: str | None = None,
        cause_category: str | None = None,
        job_kind: str | None = None,
    ) -> Diagnosis:
        return Diagnosis(
            verdict=verdict,
            incident_id=evidence.incident_id,
            service=evidence.service,
            environment=evidence.environment,
            reasoning=Reasoning(summary, tuple(seen), _clamp(confidence), NAME),
            suspected_dependency=suspected_dependency,
            failure_mode=failure_mode,
            cause_category=cause_category,
            job_kind=job_kind,
        )

    # -------------------------------------------------------------- proposal

    def propose(self, diagnosis: Diagnosis, topology: Topology) -> Proposal:
        if diagnosis.event_id is None:
            raise ValueError("a proposal answers a diagnosis record: its event id is needed")
        if diagnosis.verdict is Verdict.NEEDS_EVIDENCE:
            raise ValueError("a request for more evidence is not a diagnosis to plan for")
        service = topology.services.get(diagnosis.service)
        if service is None:
            raise ReasoningFailed(
                f"{diagnosis.service} is not in the topology {topology.source} reports "
                "(no p95 or no latency threshold for it)",
                reasoner=NAME,
            )
        if not service.degraded and (
            diagnosis.verdict is Verdict.DEPENDENCY_FAILURE or diagnosis.cause_category == "capacity"
        ):
            raise ReasoningFailed(
                f"{service.name} is within its threshold ({service.p95_ms:.0f} ms against "
                f"{service.threshold_ms:.0f} ms): there is no shortage to scale out of or fail over from, "
                "so no action; a person decides",
                reasoner=NAME,
            )
        seen = _service_evidence(topology, service)
        basis = self._basis(diagnosis, topology, seen)
        factor = 1.0
        if diagnosis.verdict is Verdict.DEPENDENCY_FAILURE and diagnosis.suspected_dependency:
            steps, factor, summary = self._dependency_plan(service, diagnosis.suspected_dependency, topology, seen)
        elif diagnosis.cause_category == "capacity":
            step, factor, summary = self._scale(service, topology, seen)
            steps = [step]
        elif diagnosis.cause_category == "bad-deployment":
            step, summary = self._rollback(service, topology)
            steps = [step]
        elif service.degraded:
            steps = [self._step(Action.RESTART, service, rolling=True)]
            summary = f"The cause is {diagnosis.cause_category or 'unknown'}: restart {service.name} one at a time."
            factor = 0.5
        else:
            raise ReasoningFailed(
                f"{service.name} is within its threshold and the cause is {diagnosis.cause_category}: "
                "no automatic plan, a person decides",
                reasoner=NAME,
            )
        reasoning = Reasoning(
            f"{summary} Diagnosis: {diagnosis.reasoning.summary}",
            (*seen, *diagnosis.reasoning.evidence),
            _clamp(basis * factor),
            NAME,
        )
        return Proposal(diagnosis.incident_id, diagnosis.event_id, tuple(steps), reasoning)

    def _basis(self, diagnosis: Diagnosis, topology: Topology, seen: list[EvidenceItem]) -> float:
        """The confidence the plan rests on: the rules' own diagnosis' as it is; for another
        reasoner's, the rules' confidence in the same conclusion from this evidence (0 when
        their reading does not reach it), noted in ``seen``. Never the other reasoner's number."""
        if diagnosis.reasoning.reasoner == NAME:
            return diagnosis.reasoning.confidence
        reread = self.diagnose(
            DiagnosticEvidence(
                incident_id=diagnosis.incident_id,
                service=diagnosis.service,
                environment=diagnosis.environment or "",
                symptom="latency",
                topology=topology,
                may_request_more=False,  # conclude from what is here: this is a check, not a request
            )
        )
        agrees = reread.verdict is diagnosis.verdict and (
            reread.suspected_dependency == diagnosis.suspected_dependency
            if diagnosis.verdict is Verdict.DEPENDENCY_FAILURE
            else reread.cause_category == diagnosis.cause_category
        )
        confidence = reread.reasoning.confidence if agrees else 0.0
        theirs = _describe(diagnosis)
        seen.append(
            EvidenceItem(
                kind="confidence-basis",
                source=f"rules reasoner: the evidence of {topology.source} read again",
                description=(
                    f"the diagnosis ({theirs}) came from the {diagnosis.reasoning.reasoner} reasoner at confidence "
                    f"{diagnosis.reasoning.confidence:.2f}, which this plan does not take; the rules "
                    + (
                        f"reach the same conclusion at {confidence:.2f}"
                        if agrees
                        else f"conclude {_describe(reread)} instead, so the plan rests on no measured confidence"
                    )
                ),
                observed_value=f"{confidence:.3f}",
            )
        )
        return confidence

    def _dependency_plan(
        self, service: ServiceView, dependency: str, topology: Topology, seen: list[EvidenceItem]
    ) -> tuple[list[PlannedStep], float, str]:
        target = service.failover_targets.get(dependency)
        failover = (
            self._step(Action.FAILOVER, service, dependency=dependency, toTarget=target)
            if target is not None and service.active_dependencies.get(dependency, dependency) != target
            else None
        )
        steps: list[PlannedStep] = []
        parts: list[str] = []
        if failover is not None and self.config.strategy in ("failover", "failover-then-scale"):
            steps.append(failover)
            parts.append(f"Fail {service.name}'s {dependency} over to {target}.")
        if self.config.strategy == "failover" and steps:
            return steps, 1.0, " ".join(parts)
        try:
            scale, factor, text = self._scale(service, topology, seen)
        except ReasoningFailed:
            if steps:  # the failover alone still helps
                return steps, 0.8, " ".join(parts)
            if failover is not None:
                return [failover], 0.8, f"{service.name} cannot scale further: fail {dependency} over to {target}."
            raise
        return [*steps, scale], factor, " ".join([*parts, text])

    def _scale(
        self, service: ServiceView, topology: Topology, seen: list[EvidenceItem]
    ) -> tuple[PlannedStep, float, str]:
        if service.replicas is None:
            raise ReasoningFailed(
                f"the evidence has no replica count for {service.key}, so no scale-out can be sized: a person decides",
                reasoner=NAME,
            )
        if service.replicas >= self.config.max_replicas:
            raise ReasoningFailed(
                f"{service.name} already runs {service.replicas} replicas, the most this agent proposes "
                f"({self.config.max_replicas}), and nothing else is possible",
                reasoner=NAME,
            )
        target = self.config.target_utilization
        utilization = topology.utilization.get(service.name)
        if utilization is not None:
            wanted = replicas_for(service.replicas, utilization, target)
            model = f"{service.replicas} replicas x utilization {utilization:.3f} / target {target:.2f} = {wanted}"
        else:  # no pool metric: latency over threshold stands in for the overload
            overload = service.p95_ms / service.threshold_ms
            wanted = replicas_for(service.replicas, overload, 1.0)
            model = (
                f"no pool utilization reported; {service.replicas} replicas x p95/threshold {overload:.2f} = {wanted}"
            )
        # A degraded service (propose() plans none for a healthy one) gets one replica more
        # at least, even where the pool model says it has enough.
        wanted = max(wanted, service.replicas + 1)
        replicas = min(wanted, self.config.max_replicas)
        seen.append(
            EvidenceItem(
                kind="latency-model",
                source="worker pool: slots in use = load x service time (Little's law)",
                description=model + (f", capped at {replicas}" if replicas < wanted else ""),
                observed_value=f"{replicas} replicas",
            )
        )
        text = f"Scale {service.name} from {service.replicas} to {replicas} replicas to restore its pool capacity."
        return self._step(Action.SCALE, service, replicas=replicas), (0.7 if replicas < wanted else 1.0), text

    def _rollback(self, service: ServiceView, topology: Topology) -> tuple[PlannedStep, str]:
        """A rollback to the revision the service last ran healthy on (without that
        knowledge, the one before the running one), named exactly as the target rolls back
        by it: both ends' revision, pod-template hash and images, from the evidence. No plan
        (a person decides) where the evidence cannot name them, forbids the rollback, or
        shows the rollout paused by someone."""
        name, healthy, previous = service.name, topology.healthy_revisions.get(service.name), service.previous_revision
        running, candidate = service.running, service.rollback_candidate

        def refuse(why: str) -> ReasoningFailed:
            return ReasoningFailed(f"{name}: no rollback planned: {why}; a person decides", reasoner=NAME)

        if service.rollback_forbidden is not None:
            raise refuse(f"its running release may not be rolled back ({service.rollback_forbidden})")
        if healthy is not None and healthy == service.revision:
            raise refuse(f"it runs {service.revision}, the revision it last ran healthy on")
        if previous is None or (healthy is not None and healthy != previous):
            raise refuse(
                f"it last ran healthy on {healthy}, which is not the revision before the running one ({previous}), "
                "and the evidence names only that one exactly"
                if healthy is not None
                else "the evidence shows no revision before the running one"
            )
        if running is None or candidate is None:
            raise refuse(
                f"{topology.source} gives no revision facts (revision, template hash, images) for "
                + ("its running revision" if running is None else f"the revision before it ({previous})")
                + ", and a rollback must name both exactly"
            )
        if service.paused:
            raise refuse("its rollout is paused: a rollback waits for someone to resume it")
        step = self._step(Action.ROLLBACK, service, **rollback_params(running, candidate))
        summary = f"Roll {name} back from {service.revision} to {previous}, the revision it " + (
            "last ran healthy on." if healthy is not None else "ran before the running one."
        )
        return step, summary

    @staticmethod
    def _step(action: Action, service: ServiceView, **params: object) -> PlannedStep:
        return PlannedStep(action, service.name, service.environment, dict(params))
