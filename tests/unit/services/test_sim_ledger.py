"""The sim's ledger on disk: a killed sim comes back remembering every key, token and count."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.sim import SimModel
from services.sim.ledger import Ledger
from services.sim.state import SimState, StaleToken


def _state(path: Path) -> SimState:
    return SimState(SimModel.default(), action_seconds=0, sleep=lambda _: None, ledger=Ledger(path))


def test_a_restarted_sim_replays_a_key_it_applied_before_and_applies_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    first = _state(path)
    applied = first.perform("scale", "checkout-api", {"replicas": 12}, "k1", 5, "executor-a")
    assert applied["replayed"] is False

    again = _state(path)  # the same file after a SIGKILL: nothing but the disk survives
    replay = again.perform("scale", "checkout-api", {"replicas": 12}, "k1", 5, "executor-a")
    assert replay["replayed"] is True and replay["after"] == applied["after"]
    assert again.applied == 1
    assert again.action_counts() == {"k1": {"requests": 2, "applied": 1}}


def test_a_restarted_sim_rebuilds_the_services_from_the_applied_actions(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    _state(path).perform("scale", "checkout-api", {"replicas": 12}, "k1", 1, None)
    assert _state(path).service("checkout-api")["replicas"] == 12


def test_a_restarted_sim_still_refuses_a_token_older_than_one_it_admitted(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    _state(path).perform("scale", "checkout-api", {"replicas": 12}, "k1", 7, None)
    with pytest.raises(StaleToken):
        _state(path).perform("scale", "checkout-api", {"replicas": 4}, "k2", 6, None)


def test_reset_empties_the_file_too(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    state = _state(path)
    state.perform("scale", "checkout-api", {"replicas": 12}, "k1", 7, None)
    state.reset()
    restarted = _state(path)
    assert restarted.action_counts() == {} and restarted.applied == 0
    assert restarted.service("checkout-api")["newestFencingToken"] is None


def test_the_ledger_refuses_to_record_a_key_twice(tmp_path: Path) -> None:
    state = _state(tmp_path / "ledger.sqlite")
    state.perform("scale", "checkout-api", {"replicas": 12}, "k1", 1, None)
    ledger = state._ledger
    recorded = ledger.applied("k1")
    assert recorded is not None
    with pytest.raises(ValueError, match="recorded twice"):
        ledger.record(recorded)
