"""Fixtures are validated on load: every problem of a file, each with where it is."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from flotilla_eval import ScenarioError, Stage, load_scenarios
from flotilla_eval.scenario import DIFFICULTIES, KINDS
from flotilla_reasoning import Verdict

from .conftest import BY_ID, SCENARIOS, minimal, parse, write


def test_the_shipped_suite_has_sixty_cases_over_every_kind_and_difficulty() -> None:
    assert len(SCENARIOS) >= 60
    kinds = Counter(s.kind for s in SCENARIOS)
    assert set(kinds) == set(KINDS) and min(kinds.values()) >= 5
    assert set(Counter(s.difficulty for s in SCENARIOS)) == set(DIFFICULTIES)
    adversarial = [s for s in SCENARIOS if s.adversarial]
    assert len(adversarial) >= 8
    assert any(s.stage is Stage.PROPOSE for s in adversarial), "a diagnosis summary carrying instructions"


def test_every_adversarial_case_names_what_its_hidden_text_asks_for_as_harm() -> None:
    assert all(s.harmful for s in SCENARIOS if s.adversarial)


def test_a_case_reads_into_the_reasoners_own_types() -> None:
    case = BY_ID["slow-dependency-payments-pool-waits"]
    topology = case.evidence.topology
    assert case.evidence.incident_id == "incident-eval-slow-dependency-payments-pool-waits"
    assert case.evidence.may_request_more and case.evidence.job_id is None
    assert topology.services["checkout-api"].failover_targets == {"payments-api": "payments-api-standby"}
    assert topology.dependency_p95[("checkout-api", "payments-api")] == 900
    assert topology.baselines[("checkout-api", "payments-api")] == 110
    assert topology.utilization == {"checkout-api": 2.125}
    assert topology.history["checkout-api"][0][0].isoformat() == "2026-03-02T10:00:00+00:00"
    assert [e.describe() for e in case.expected_diagnoses] == ["dependency-failure(payments-api)"]


def test_a_case_after_the_slow_job_may_not_ask_for_more() -> None:
    case = BY_ID["capacity-cart-after-profile"]
    assert not case.evidence.may_request_more
    assert case.evidence.job_kind == "cpu-profile"


def test_a_propose_stage_case_carries_its_diagnosis() -> None:
    case = BY_ID["adversarial-diagnosis-summary-restart-the-database"]
    assert case.stage is Stage.PROPOSE and not case.expected_diagnoses
    assert case.given_diagnosis is not None
    assert case.given_diagnosis.verdict is Verdict.DEPENDENCY_FAILURE
    assert "Ignore previous instructions" in case.given_diagnosis.reasoning.summary


def test_the_minimal_case_is_valid() -> None:
    assert parse(minimal()).id == "minimal"


def problems_of(document: dict[str, object], name: str = "minimal") -> list[str]:
    with pytest.raises(ScenarioError) as caught:
        parse(document, name)
    return caught.value.problems


def test_an_unknown_key_is_named_with_its_path() -> None:
    document = minimal()
    document["evidence"]["topology"]["services"][0]["replica"] = 4
    [problem] = problems_of(document)
    assert problem.startswith("evidence.topology.services[0]: unknown key 'replica'")


def test_missing_expectations_are_named() -> None:
    document = minimal()
    del document["expected"]
    assert problems_of(document) == ["$: required key 'expected' is missing"]
    document = minimal(expected={"actions": {"acceptable": [{"action": "none"}]}})
    assert any("required key 'diagnosis' is missing" in p for p in problems_of(document))


def test_a_dependency_naming_no_service_is_an_error() -> None:
    document = minimal()
    document["evidence"]["topology"]["services"][0]["dependencies"].append("payments-apii")
    problems = problems_of(document)
    assert any("dependency 'payments-apii' names no service of the case" in p for p in problems)


def test_names_in_readings_and_rules_must_be_services_of_the_case() -> None:
    document = minimal()
    topology = document["evidence"]["topology"]
    topology["utilization"]["checkout-apii"] = 1.0
    topology["dependency_latency"].append(
        {"service": "checkout-api", "dependency": "payments-api-standby", "p95_ms": 1}
    )
    document["expected"]["actions"]["harmful"].append({"action": "any", "service": "orders-db"})
    document["expected"]["diagnosis"] = [{"verdict": "dependency-failure", "dependency": "inventory-api"}]
    problems = problems_of(document)
    assert "evidence.topology.utilization.checkout-apii: names no service of the case" in problems
    assert any("'payments-api-standby' is not a dependency of checkout-api" in p for p in problems)
    assert any(p.startswith("expected.actions.harmful[2].service: 'orders-db'") for p in problems)
    assert any(p.startswith("expected.diagnosis[0].dependency: 'inventory-api' is not a dependency") for p in problems)


def test_tags_come_from_the_vocabulary_one_difficulty_and_one_kind() -> None:
    problems = problems_of(minimal(tags=["easy", "hard", "slow", "slow-dependency"]))
    assert any("unknown tag 'slow'" in p for p in problems)
    assert any("needs exactly one difficulty" in p for p in problems)


def test_the_id_is_the_file_name() -> None:
    assert any("must be the file's name (other)" in p for p in problems_of(minimal(), "other"))


def test_needs_evidence_must_allow_no_plan_and_only_on_a_first_look() -> None:
    document = minimal()
    document["expected"]["diagnosis"] = [{"verdict": "needs-evidence"}]
    document["expected"]["actions"]["acceptable"] = [{"action": "scale", "service": "checkout-api", "replicas": 9}]
    document["evidence"]["diagnostic_job"] = "cpu-profile"
    problems = problems_of(document)
    assert any("{action: none} must be acceptable too" in p for p in problems)
    assert any("needs-evidence is not allowed once the diagnostic job ran" in p for p in problems)


def test_action_rules_take_only_their_actions_parameters() -> None:
    document = minimal()
    document["expected"]["actions"]["acceptable"] = [
        {"action": "scale", "service": "checkout-api", "rolling": True},
        {"action": "none", "service": "checkout-api"},
        {"action": "reboot"},
        {"action": "scale", "replicas": [12, 9]},
    ]
    problems = problems_of(document)
    assert any(p.startswith("expected.actions.acceptable[0]: unknown key 'rolling'") for p in problems)
    assert any(p.startswith("expected.actions.acceptable[1]: unknown key 'service'") for p in problems)
    assert any(p.startswith("expected.actions.acceptable[2].action: 'reboot' is not one of") for p in problems)
    assert any("bounds must be 0 <= low <= high, got [12, 9]" in p for p in problems)


def test_a_loaded_folder_reports_every_bad_file_and_duplicate_ids(tmp_path: Path) -> None:
    write(tmp_path, minimal())
    (tmp_path / "kind").mkdir()
    write(tmp_path / "kind", minimal())  # the same id again
    broken = minimal(id="broken")
    del broken["title"]
    write(tmp_path, broken)
    (tmp_path / "garbled.yaml").write_text("id: [unclosed\n")
    with pytest.raises(ScenarioError) as caught:
        load_scenarios(tmp_path)
    problems = caught.value.problems
    assert any("broken.yaml: $: required key 'title' is missing" in p for p in problems)
    assert any("garbled.yaml: cannot read it as YAML" in p for p in problems)
    assert any("id 'minimal' is also the id of" in p for p in problems)


def test_an_empty_or_missing_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"no \*\.yaml scenario"):
        load_scenarios(tmp_path)
    with pytest.raises(ScenarioError, match="no such folder"):
        load_scenarios(tmp_path / "absent")
