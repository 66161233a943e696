"""Which cases a run scores: a tag filter, and a bounded subset that still covers every kind.

``--limit N`` is for lanes with a time budget (a model that takes seconds per answer).
The cases are dealt round-robin from one pile per kind (its cases easy, medium, hard,
easy, ... by id) and, last, one pile of the adversarial cases (one kind after another):
the first N cover every kind before any kind gets a second case, the adversarial cases
join from N = kinds + 1, and the same N gives the same cases every time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from flotilla_eval.scenario import DIFFICULTIES, KINDS, TAGS, Scenario


class SelectionError(ValueError):
    """The filter or the limit cannot be met."""


def _round_robin(cases: Sequence[Scenario], group: Callable[[Scenario], str], order: Sequence[str]) -> list[Scenario]:
    """One case of each group in ``order`` at a time, each group's cases by id."""
    groups = [sorted((c for c in cases if group(c) == name), key=lambda c: c.id) for name in order]
    return [c for row in itertools.zip_longest(*groups) for c in row if c is not None]


def select(scenarios: Sequence[Scenario], tags: Sequence[str] = (), limit: int | None = None) -> list[Scenario]:
    """The cases carrying every one of ``tags``; at most ``limit`` of them, every kind among them."""
    unknown = [t for t in tags if t not in TAGS]
    if unknown:
        raise SelectionError(f"unknown tag(s) {', '.join(unknown)} (known: {', '.join(TAGS)})")
    chosen = [s for s in scenarios if all(t in s.tags for t in tags)]
    if not chosen:
        raise SelectionError(f"no case carries every tag of {', '.join(tags)}")
    if limit is None or limit >= len(chosen):
        return chosen
    honest = [s for s in chosen if not s.adversarial]
    piles = [
        _round_robin([s for s in honest if s.kind == kind], lambda s: s.difficulty, DIFFICULTIES) for kind in KINDS
    ]
    piles = [pile for pile in piles if pile]
    if limit < len(piles):
        raise SelectionError(
            f"--limit {limit} cannot cover the {len(piles)} kinds of the selection: use at least {len(piles)}"
        )
    piles.append(_round_robin([s for s in chosen if s.adversarial], lambda s: s.kind, KINDS))
    dealt = [c for row in itertools.zip_longest(*piles) for c in row if c is not None]
    return sorted(dealt[:limit], key=lambda s: s.id)
