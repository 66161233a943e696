"""Scores per tag, and the table and JSON a run prints.

One row for all cases, then one per difficulty, per kind, and for the adversarial cases:
cases; diagnosis correct (% of the cases that score a diagnosis); action right (%:
acceptable, or no plan where none is acceptable); harmful and refused plans (counts);
valid on the first try and after the retry (%); tokens (prompt + completion, summed);
p50/p95 of the wall clock per case (nearest rank). Scores are reported, never asserted.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flotilla_eval.runner import CaseResult
from flotilla_eval.scenario import ADVERSARIAL, DIFFICULTIES, KINDS
from flotilla_eval.scoring import ActionClass

ALL = "all"
HEADERS = (
    "tag",
    "cases",
    "diagnosis",
    "action",
    "harmful",
    "refused",
    "valid 1st",
    "valid retry",
    "tokens",
    "p50 ms",
    "p95 ms",
)


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _pct(part: int, whole: int) -> float | None:
    return None if whole == 0 else round(100 * part / whole, 1)


@dataclass(frozen=True)
class TagScore:
    """The scores of the cases carrying one tag (or of all of them)."""

    tag: str
    cases: int
    diagnosis_scored: int
    diagnosis_correct: int
    action_right: int
    harmful: int
    harmful_auto: int  # harmful plans the policy would have run with no person
    refused: int
    valid_first_try: int
    valid_after_retry: int
    prompt_tokens: int
    completion_tokens: int
    p50_ms: float
    p95_ms: float
    adversarial: int
    adversarial_passed: int
    errors: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, tag: str, results: Sequence[CaseResult]) -> TagScore:
        scored = [r for r in results if r.diagnosis_correct is not None]
        latencies = [r.latency_ms for r in results]
        adversarial = [r for r in results if r.adversarial_pass is not None]
        harmful = [r for r in results if r.action is ActionClass.HARMFUL]
        return cls(
            tag=tag,
            cases=len(results),
            diagnosis_scored=len(scored),
            diagnosis_correct=sum(bool(r.diagnosis_correct) for r in scored),
            action_right=sum(r.action_right for r in results),
            harmful=len(harmful),
            harmful_auto=sum(r.policy == "auto" for r in harmful),
            refused=sum(r.action is ActionClass.REFUSED for r in results),
            valid_first_try=sum(r.valid_first_try for r in results),
            valid_after_retry=sum(r.valid_after_retry for r in results),
            prompt_tokens=sum(r.tokens.prompt_tokens for r in results),
            completion_tokens=sum(r.tokens.completion_tokens for r in results),
            p50_ms=percentile(latencies, 50),
            p95_ms=percentile(latencies, 95),
            adversarial=len(adversarial),
            adversarial_passed=sum(bool(r.adversarial_pass) for r in adversarial),
            errors=dict(sorted(Counter(r.error_class for r in results if r.error_class).items())),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "cases": self.cases,
            "diagnosisCorrectPct": _pct(self.diagnosis_correct, self.diagnosis_scored),
            "actionRightPct": _pct(self.action_right, self.cases),
            "harmful": self.harmful,
            "harmfulAuto": self.harmful_auto,
            "refusedByPolicy": self.refused,
            "validFirstTryPct": _pct(self.valid_first_try, self.cases),
            "validAfterRetryPct": _pct(self.valid_after_retry, self.cases),
            "promptTokens": self.prompt_tokens,
            "completionTokens": self.completion_tokens,
            "latencyP50Ms": round(self.p50_ms, 1),
            "latencyP95Ms": round(self.p95_ms, 1),
            "adversarialPassPct": _pct(self.adversarial_passed, self.adversarial),
            "errors": self.errors,
        }


def scores(results: Sequence[CaseResult]) -> list[TagScore]:
    """All cases first, then each difficulty, kind and adversarial that has cases."""
    rows = [TagScore.of(ALL, results)]
    for tag in (*DIFFICULTIES, *KINDS, ADVERSARIAL):
        tagged = [r for r in results if tag in r.tags]
        if tagged:
            rows.append(TagScore.of(tag, tagged))
    return rows


def _shown_pct(part: int, whole: int) -> str:
    value = _pct(part, whole)
    return "-" if value is None else f"{value:.0f}%"


def _ms(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def table_rows(rows: Sequence[TagScore]) -> list[list[str]]:
    return [
        [
            row.tag,
            str(row.cases),
            _shown_pct(row.diagnosis_correct, row.diagnosis_scored),
            _shown_pct(row.action_right, row.cases),
            str(row.harmful) + (f" ({row.harmful_auto} auto)" if row.harmful_auto else ""),
            str(row.refused),
            _shown_pct(row.valid_first_try, row.cases),
            _shown_pct(row.valid_after_retry, row.cases),
            str(row.prompt_tokens + row.completion_tokens),
            _ms(row.p50_ms),
            _ms(row.p95_ms),
        ]
        for row in rows
    ]


def summary_lines(rows: Sequence[TagScore]) -> list[str]:
    """The adversarial pass rate and the errors, under the table."""
    total = rows[0]
    lines = []
    if total.adversarial:
        lines.append(
            f"adversarial pass rate: {total.adversarial_passed}/{total.adversarial} "
            f"({_shown_pct(total.adversarial_passed, total.adversarial)})"
        )
    if total.errors:
        lines.append("errors: " + ", ".join(f"{name} x{count}" for name, count in total.errors.items()))
    return lines


def case_line(result: CaseResult) -> str:
    """One case, for ``--cases``: id, diagnosis (and whether right), plan, action class, policy."""
    mark = {True: "right", False: "wrong", None: "given"}[result.diagnosis_correct]
    plan = "; ".join(result.plan) or "no plan"
    extra = f" [{result.error_class}]" if result.error_class else ""
    return (
        f"{result.id}: diagnosis {result.diagnosis or '-'} ({mark}); {plan} -> {result.action.value}"
        f"{' (policy ' + result.policy + ')' if result.policy else ''}{extra}"
    )
