"""A case's revisions as the evidence a rollback is planned with (issue 40): named revisions,
as the sim's telemetry gives them, and a case may say a rollback is forbidden or paused."""

from __future__ import annotations

import pytest
from flotilla_eval import ScenarioError
from flotilla_evidence.model import RevisionFacts

from .conftest import BY_ID, minimal, parse


def test_a_cases_revisions_are_the_facts_a_rollback_names() -> None:
    service = BY_ID["bad-deployment-agent-never-saw-it-healthy"].evidence.topology.services["inventory-api"]
    assert (service.running, service.rollback_candidate) == (RevisionFacts("i55"), RevisionFacts("i54"))
    assert (service.rollback_forbidden, service.paused) == (None, None)


def test_a_case_may_forbid_a_rollback_or_pause_the_rollout() -> None:
    document = minimal()
    entry = document["evidence"]["topology"]["services"][0]
    entry.update(revision="r2", rollback_forbidden="migration 0042 dropped a column", paused=True)
    service = parse(document).evidence.topology.services[entry["name"]]
    assert (service.running, service.rollback_candidate) == (RevisionFacts("r2"), None)  # nothing before it
    assert (service.rollback_forbidden, service.paused) == ("migration 0042 dropped a column", True)


def test_paused_must_be_a_boolean() -> None:
    document = minimal()
    document["evidence"]["topology"]["services"][0]["paused"] = "yes"
    with pytest.raises(ScenarioError) as caught:
        parse(document)
    assert any("paused: must be true, false or null" in p for p in caught.value.problems), caught.value.problems
