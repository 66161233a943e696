"""One incident is one trace: every member's spans, exported over OTLP by the real fleet,
join into a single tree rooted where the health agent opened the incident."""

from __future__ import annotations

import time
from collections import Counter

from .fleet import Fleet, Watch, open_incident
from .otlp import OtlpReceiver, ReceivedSpan

# The services an auto-authorized incident passes through, and what each must have handled.
HANDLED = {
    "diagnostic-agent": "DiagnosisRequested",
    "remediation-agent": "DependencyFailureSuspected",
    "policy-service": "RecoveryProposed",
    "executor": "ScaleService",
    "health-agent": "RecoveryExecuted",
}


def _incident_spans(otlp: OtlpReceiver, incident: str) -> list[ReceivedSpan]:
    """Every span of the incident's trace (the trace of the spans naming the incident)."""
    spans = otlp.spans()
    traces = {s.trace_id for s in spans if s.attributes.get("flotilla.incident_id") == incident}
    return [s for s in spans if s.trace_id in traces]


def test_one_incident_is_one_trace_across_every_service(fleet: Fleet, watch: Watch, otlp: OtlpReceiver) -> None:
    fleet.wait_until_healthy("checkout-dev")
    incident = open_incident(fleet, watch, service="checkout-dev", dependency="payments-dev")
    watch.kind("RecoveryCompleted", incident, timeout=120)
    deadline = time.monotonic() + 20  # batches of spans leave every 200 ms; the last ones may lag
    while True:
        spans = _incident_spans(otlp, incident)
        handled = {(s.service, str(s.attributes.get("flotilla.record_type", "")).rsplit(".", 1)[-1]) for s in spans}
        if set(HANDLED.items()) <= handled or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    fleet.reset_sim()
    fleet.wait_until_healthy("checkout-dev")

    missing = set(HANDLED.items()) - handled
    assert not missing, f"no span for {sorted(missing)}; got {sorted(handled)}"
    assert len({s.trace_id for s in spans}) == 1, "the incident's spans are in more than one trace"
    # one tree: one root (the health agent publishing the incident), every parent present
    by_id = {s.span_id: s for s in spans}
    roots = [s for s in spans if s.parent_span_id is None]
    assert [(r.service, r.name) for r in roots] == [("health-agent", "ServiceLatencyIncreased publish")], roots
    orphans = [s for s in spans if s.parent_span_id is not None and s.parent_span_id not in by_id]
    assert not orphans, f"spans whose parent is missing: {[(o.service, o.name) for o in orphans]}"
    # the executor's call to the target is a child of its command's span
    [apply] = [s for s in spans if s.service == "executor" and s.name == "scale apply"]
    assert apply.parent_span_id is not None
    assert by_id[apply.parent_span_id].attributes["flotilla.record_type"].endswith("ScaleService")
    # every handled record's span says what happened to it, none of them failed
    consumed = [s for s in spans if "flotilla.record_type" in s.attributes]
    assert all(s.attributes.get("flotilla.outcome") for s in consumed)
    assert not [s for s in spans if s.error], "a span of the happy path ended in error"
    print("spans per service:", dict(Counter(s.service for s in spans)))
