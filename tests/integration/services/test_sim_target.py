"""``python -m services.sim`` as its own process, driven through the executor's SimTarget.

Needs no stack: the sim keeps no state outside its process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.executor.targets import SimTarget, StaleFencingToken, TargetRejected

REPO_ROOT = Path(__file__).resolve().parents[3]
KEY = "incident-204:scale:12"
ACTION_TOKEN = "integration-sim-action-token"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _sim_env(tmp_path: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOTILLA_")}
    env.update(
        FLOTILLA_SIM_HOST="127.0.0.1",
        FLOTILLA_SIM_PORT=str(port),
        FLOTILLA_SIM_ACTION_SECONDS="0.1",
        FLOTILLA_ENV_FILE=str(tmp_path / "absent.env"),
    )
    return env


@pytest.fixture
def sim_url(tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    env = {**_sim_env(tmp_path, port), "FLOTILLA_SIM_ACTION_TOKEN": ACTION_TOKEN}
    with (tmp_path / "sim.log").open("w+") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.sim"], cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(process, url, log)
            yield url
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                returncode = process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise
        log.seek(0)
        output = log.read()
    # uvicorn stops gracefully, then re-raises the signal it caught
    assert returncode in (0, -signal.SIGTERM), output
    assert "Finished server process" in output, output


def _wait_healthy(process: subprocess.Popen[bytes], url: str, log: IO[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            pytest.fail(f"sim exited with {process.returncode}:\n{log.read()}")
        try:
            response = httpx.get(f"{url}/healthz", timeout=1)
            if response.status_code == 200 and response.json() == {"status": "ok", "service": "sim"}:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail("sim did not answer /healthz within 30 s")


def _checkout_p95(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sim_latency_p95_ms" and sample.labels.get("service") == "checkout-api":
                return float(sample.value)
    raise AssertionError(f"no checkout-api p95 in /metrics:\n{text}")


def test_fault_scale_replay_and_stale_token(sim_url: str) -> None:
    assert _checkout_p95(sim_url) < 500
    fault = httpx.post(f"{sim_url}/faults", json={"service": "payments-api", "kind": "dependency-slow"})
    assert fault.status_code == 201
    assert _checkout_p95(sim_url) > 1500

    with SimTarget(sim_url, ACTION_TOKEN, timeout=5) as target:
        result = target.apply("scale", "production/checkout-api", {"replicas": 12}, KEY, 1, "executor-it")
        assert (result.replayed, result.before["replicas"], result.after["replicas"]) == (False, 4, 12)
        assert result.duration_ms >= 100  # FLOTILLA_SIM_ACTION_SECONDS reached the process
        assert _checkout_p95(sim_url) < 500

        replay = target.apply("scale", "production/checkout-api", {"replicas": 12}, KEY, 1, "executor-it")
        assert replay.replayed is True
        assert replay.applied_at == result.applied_at
        assert target.lookup(KEY) == result

        with pytest.raises(StaleFencingToken) as caught:
            target.apply("scale", "production/checkout-api", {"replicas": 4}, "incident-204:scale:4", 0, "zombie")
        assert (caught.value.token, caught.value.newest) == (0, 1)
        assert target.lookup("incident-204:scale:4") is None

    assert httpx.get(f"{sim_url}/services/checkout-api").json()["replicas"] == 12
    assert _checkout_p95(sim_url) < 500


def test_only_the_token_holder_acts(sim_url: str) -> None:
    with SimTarget(sim_url, "someone-elses-sim-token", timeout=5) as stranger, pytest.raises(TargetRejected) as caught:
        stranger.apply("scale", "production/checkout-api", {"replicas": 20}, "intruder", 2**62, "mallory")
    assert caught.value.status == 401
    refused = httpx.post(f"{sim_url}/actions/scale", json={"resource": "checkout-api", "params": {"replicas": 20}})
    assert refused.status_code == 401
    service = httpx.get(f"{sim_url}/services/checkout-api").json()
    assert (service["replicas"], service["newestFencingToken"]) == (4, None)


def test_the_sim_does_not_start_without_a_token(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services.sim"],
        cwd=REPO_ROOT,
        env=_sim_env(tmp_path, _free_port()),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FLOTILLA_SIM_ACTION_TOKEN is not set" in done.stderr
