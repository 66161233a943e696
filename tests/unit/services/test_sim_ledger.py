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


def test_the_sim_settings_build_a_generated_estate_with_its_ledger_on_disk(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient
    from pydantic import SecretStr

    from services.sim.app import build_app
    from services.sim.settings import SimSettings

    token = "executor-only-sim-action-token"
    settings = SimSettings(
        sim_services=20,
        sim_production_share=0,
        sim_ledger_file=tmp_path / "ledger.sqlite",
        sim_action_token=SecretStr(token),
        sim_action_seconds=0,
    )
    client = TestClient(build_app(settings), headers={"Authorization": f"Bearer {token}"})
    services = client.get("/services").json()
    assert len(services) == 20 and {s["environment"] for s in services} == {"dev"}
    body = {"resource": "shop-0003", "params": {"replicas": 9}, "idempotencyKey": "k", "fencingToken": 1}
    assert client.post("/actions/scale", json=body).status_code == 200
    again = TestClient(build_app(settings), headers={"Authorization": f"Bearer {token}"})  # a restart
    assert again.get("/services/shop-0003").json()["replicas"] == 9
    assert again.get("/action-counts").json()["keys"] == {"k": {"requests": 1, "applied": 1}}
