"""Scores per tag: percentages of what applies, counts, nearest-rank latency."""

from __future__ import annotations

from flotilla_eval import ActionClass, CaseResult, scores
from flotilla_eval.report import HEADERS, percentile, summary_lines, table_rows
from flotilla_eval.runner import Decision, Status
from flotilla_reasoning import TokenUsage

NO_TOKENS = TokenUsage()


def result(
    case_id: str,
    tags: tuple[str, ...],
    *,
    correct: bool | None = True,
    action: ActionClass = ActionClass.ACCEPTABLE,
    right: bool = True,
    policy: str | None = "auto",
    attempts: int = 1,
    status: Status = Status.DECIDED,
    error: str | None = None,
    latency: float = 10.0,
    tokens: TokenUsage = NO_TOKENS,
    adversarial: bool | None = None,
) -> CaseResult:
    return CaseResult(
        id=case_id,
        tags=tags,
        diagnosis="d",
        diagnosis_correct=correct,
        plan=(),
        action=action,
        action_right=right,
        policy=policy,
        policy_reasons=(),
        decisions=(Decision("diagnose", status, attempts, tokens, error),),
        latency_ms=latency,
        adversarial_pass=adversarial,
    )


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 50) == 10 and percentile(values, 95) == 19 and percentile(values, 100) == 20
    assert percentile([], 95) == 0


def test_scores_per_tag() -> None:
    results = [
        result("a", ("easy", "capacity"), latency=5, tokens=TokenUsage(100, 10)),
        result("b", ("hard", "capacity"), correct=False, action=ActionClass.HARMFUL, right=False, latency=50),
        result(
            "c",
            ("hard", "external", "adversarial"),
            correct=None,
            action=ActionClass.REFUSED,
            right=False,
            policy="deny",
            adversarial=False,
            attempts=2,
        ),
        result(
            "d",
            ("easy", "external"),
            status=Status.ERROR,
            error="APIConnectionError",
            action=ActionClass.NONE,
            policy=None,
            correct=False,
        ),
    ]
    rows = {row.tag: row for row in scores(results)}
    assert list(rows) == ["all", "easy", "hard", "capacity", "external", "adversarial"]
    everything = rows["all"].to_json()
    assert everything["cases"] == 4
    assert everything["diagnosisCorrectPct"] == 33.3  # 1 of the 3 that score a diagnosis
    assert everything["actionRightPct"] == 50.0  # a, and d (no plan, which it accepts)
    assert (everything["harmful"], everything["harmfulAuto"], everything["refusedByPolicy"]) == (1, 1, 1)
    assert everything["validFirstTryPct"] == 50.0 and everything["validAfterRetryPct"] == 75.0
    assert everything["promptTokens"] == 100 and everything["completionTokens"] == 10
    assert everything["adversarialPassPct"] == 0.0
    assert everything["errors"] == {"APIConnectionError": 1}
    assert rows["capacity"].to_json()["latencyP95Ms"] == 50.0
    assert rows["adversarial"].to_json()["diagnosisCorrectPct"] is None
    table = table_rows(list(rows.values()))
    assert len(table[0]) == len(HEADERS) and table[0][4] == "1 (1 auto)"
    assert table[-1][2] == "-"
    assert summary_lines(list(rows.values())) == ["adversarial pass rate: 0/1 (0%)", "errors: APIConnectionError x1"]
