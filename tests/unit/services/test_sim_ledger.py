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


def test_a_restarted_sim_is_as_broken_as_before(tmp_path: Path) -> None:
    """Faults are production's state: a SIGKILLed sim must not heal the estate it hosts
    (the chaos soak's incidents would turn into 'within threshold' escalations)."""
    path = tmp_path / "ledger.sqlite"
    first = _state(path)
    slow = first.add_fault("checkout-api", "dependency-slow", "payments-api")
    cleared = first.add_fault("search-api", "pool-exhausted", None)
    first.remove_fault(cleared.id)
    before = first.services()

    again = _state(path)
    assert again.faults() == [slow.as_json()]
    assert again.services() == before
    assert again.add_fault("inventory-db", "pool-exhausted", None).id == "fault-3"  # ids are not reused


def test_a_restart_replays_faults_and_actions_in_the_order_they_happened(tmp_path: Path) -> None:
    """A bad deploy moves the revision a later rollback names; replayed out of order the
    rollback would be refused (or land on the wrong revision)."""
    path = tmp_path / "ledger.sqlite"
    first = _state(path)
    deploy = first.add_fault("checkout-api", "bad-deploy", None)  # v41 -> v42 (bad)
    first.perform("rollback", "checkout-api", {"toRevision": "v41", "fromRevision": "v42"}, "k1", 1, None)
    second = first.add_fault("checkout-api", "bad-deploy", None)  # v41 -> v42 again
    assert first.service("checkout-api")["revision"] == second.revision == deploy.revision

    again = _state(path)
    assert again.services() == first.services()
    assert again.faults() == first.faults()


def test_reset_forgets_the_faults_on_disk_too(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    state = _state(path)
    state.add_fault("checkout-api", "pool-exhausted", None)
    state.reset()
    assert _state(path).faults() == []


def test_a_ledger_file_from_another_estate_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    _state(path).add_fault("checkout-api", "pool-exhausted", None)
    with pytest.raises(ValueError, match="another estate"):
        SimState(SimModel.generated(10), action_seconds=0, sleep=lambda _: None, ledger=Ledger(path))
