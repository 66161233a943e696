"""Nobody acts on the running fleet's sim but the executor.

The sim stands for production: a direct ``POST /actions/scale`` would change it outside
policy, the executor and the audit (security review M4), and a huge fencing token would
fence the executor out. The fleet's sim admits only the holder of the action token the
local fleet gave it and the executor; anyone else gets 401 and nothing changes.
"""

from __future__ import annotations

import uuid

import pytest

from flotilla.fleet import SIM

from .fleet import DEMO_SERVICE, Fleet, HttpError

pytestmark = pytest.mark.timeout(120)


def test_an_unauthenticated_sim_action_is_refused(fleet: Fleet) -> None:
    before = fleet.sim("GET", f"/services/{DEMO_SERVICE}")
    key = f"e2e-intruder-{uuid.uuid4().hex[:8]}:scale"
    body = {
        "resource": f"production/{DEMO_SERVICE}",
        "params": {"replicas": before["replicas"] + 7},
        "idempotencyKey": key,
        "fencingToken": 2**62,  # would fence the executor out of the resource
        "holder": "intruder",
    }
    for token in (None, "not-the-fleets-sim-action-token"):
        with pytest.raises(HttpError) as refused:
            fleet.call(SIM, "POST", "/actions/scale", body, token)
        assert refused.value.status == 401, refused.value.body
        with pytest.raises(HttpError) as looked:  # nor may it read the ledger
            fleet.call(SIM, "GET", f"/actions/{key}", token=token)
        assert looked.value.status == 401, looked.value.body

    after = fleet.sim("GET", f"/services/{DEMO_SERVICE}")
    assert after["replicas"] == before["replicas"]
    assert after["newestFencingToken"] == before["newestFencingToken"]
    # The executor's token is admitted by the same sim: the refusals above were the token's,
    # and the key was never applied.
    with pytest.raises(HttpError) as unknown:
        fleet.sim_action("GET", f"/actions/{key}")
    assert unknown.value.status == 404, unknown.value.body
