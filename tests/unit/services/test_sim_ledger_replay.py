"""Property: whatever faults and actions a sim saw, a restart from its ledger file
rebuilds the same estate (services, faults, tokens, counts)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from services.sim import SimModel
from services.sim.ledger import Ledger
from services.sim.model import InvalidAction, UnknownResource
from services.sim.state import KeyReused, SimState, StaleToken

SERVICES = ["checkout-api", "payments-api", "inventory-db", "search-api", "checkout-dev"]

raise_fault = st.tuples(
    st.just("raise"),
    st.sampled_from(SERVICES),
    st.sampled_from(["dependency-slow", "pool-exhausted", "bad-deploy", "rollback-forbidden"]),
)
clear_fault = st.tuples(st.just("clear"), st.integers(min_value=1, max_value=8))
scale = st.tuples(st.just("scale"), st.sampled_from(SERVICES), st.integers(min_value=1, max_value=12))
rollback = st.tuples(st.just("rollback"), st.sampled_from(SERVICES), st.sampled_from(["v16", "v40", "v41", "v42"]))
steps = st.lists(st.one_of(raise_fault, clear_fault, scale, rollback), max_size=25)


def _state(path: Path) -> SimState:
    return SimState(SimModel.default(), action_seconds=0, sleep=lambda _: None, ledger=Ledger(path))


def _run(state: SimState, step: tuple[Any, ...], n: int) -> None:
    """One step; a step the model refuses changes nothing, as at the real sim."""
    try:
        if step[0] == "raise":
            state.add_fault(step[1], step[2], None)
        elif step[0] == "clear":
            state.remove_fault(f"fault-{step[1]}")
        elif step[0] == "scale":
            state.perform("scale", step[1], {"replicas": step[2]}, f"k{n}", n, None)
        else:  # from the revision running now, a rollback the sim may take
            running = state.service(step[1])["revision"]
            state.perform("rollback", step[1], {"toRevision": step[2], "fromRevision": running}, f"k{n}", n, None)
    except (InvalidAction, UnknownResource, KeyReused, StaleToken):
        pass


@settings(max_examples=60, deadline=None)
@given(steps)
def test_a_restart_rebuilds_the_same_estate(history: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ledger.sqlite"
        live = _state(path)
        for n, step in enumerate(history):
            _run(live, step, n)
        restarted = _state(path)
        assert restarted.services() == live.services()
        assert restarted.faults() == live.faults()
        assert restarted.action_counts() == live.action_counts()
