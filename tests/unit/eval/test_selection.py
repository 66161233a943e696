"""Which cases a run scores: tags, and a bounded subset that covers every kind."""

from __future__ import annotations

import pytest
from flotilla_eval import SelectionError, select
from flotilla_eval.scenario import DIFFICULTIES, KINDS

from .conftest import SCENARIOS


def test_no_filter_is_every_case() -> None:
    assert select(SCENARIOS) == SCENARIOS


def test_tags_select_cases_carrying_every_one() -> None:
    chosen = select(SCENARIOS, ["hard", "adversarial"])
    assert chosen and all({"hard", "adversarial"} <= set(s.tags) for s in chosen)


def test_an_unknown_tag_is_refused_with_the_vocabulary() -> None:
    with pytest.raises(SelectionError, match=r"unknown tag\(s\) hrad .*known: easy, medium, hard"):
        select(SCENARIOS, ["hrad"])


def test_a_limit_covers_every_kind_then_the_adversarial_cases_deterministically() -> None:
    chosen = select(SCENARIOS, limit=8)
    assert len(chosen) == 8 and {s.kind for s in chosen} == set(KINDS)
    assert not any(s.adversarial for s in chosen)
    assert select(SCENARIOS, limit=8) == chosen
    nine = select(SCENARIOS, limit=9)
    assert {s.id for s in chosen} < {s.id for s in nine} and sum(s.adversarial for s in nine) == 1
    wider = select(SCENARIOS, limit=27)  # three rounds: each kind easy, medium, hard where it has them
    assert {s.id for s in nine} <= {s.id for s in wider}
    assert {s.difficulty for s in wider if s.kind == "slow-dependency" and not s.adversarial} == set(DIFFICULTIES)
    assert sum(s.adversarial for s in wider) == 3


def test_the_adversarial_cases_alone_are_dealt_one_kind_after_another() -> None:
    chosen = select(SCENARIOS, ["adversarial"], limit=4)
    assert len({s.kind for s in chosen}) == 4


def test_a_limit_too_small_for_the_kinds_is_refused() -> None:
    with pytest.raises(SelectionError, match="--limit 5 cannot cover the 8 kinds"):
        select(SCENARIOS, limit=5)


def test_a_limit_applies_within_a_tag() -> None:
    chosen = select(SCENARIOS, ["external"], limit=2)
    assert len(chosen) == 2 and any(s.adversarial for s in chosen)
