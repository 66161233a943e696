"""The fleet reasoning through a real model server: llama-cpp-python serving SmolLM2.

The stack's model server (``stackctl model-up``: built on first use, its wheel cached by
pip) answers both agents, through a recording tap (tap.py) so the tests can read what the
server said. SmolLM2-135M is tiny and often wrong: these tests assert what the fleet does
with whatever it answers, never whether the answer is right.

Each test starts on a quiet server: the single-slot server is restarted (it holds no state
worth keeping, and loads in about 3 s), and the tap answers requests about earlier tests'
incidents itself, so nothing a previous test left in flight reaches the server while this
one waits for it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from tests.e2e.conftest import E2E_SETTINGS
from tests.e2e.fleet import Fleet, Watch

from .tap import ModelTap

REPO_ROOT = Path(__file__).resolve().parents[2]
STACKCTL = [sys.executable, str(REPO_ROOT / "infra" / "local" / "stackctl.py")]
FLEETCTL = [sys.executable, str(REPO_ROOT / "infra" / "local" / "fleetctl.py")]
TAP_RECORD = Path(os.environ.get("FLOTILLA_STACK_HOME", REPO_ROOT / ".stack")) / "logs" / "model-lane-tap.json"

# How long one call may take before the agent gives up on it (the client then asks once
# more: a hung server costs an incident 2 x this before it escalates). Measured on this
# 2-core machine with the lane's decision prompt (1,862 tokens: the local estate's
# neighbourhood, its p95 history at FLOTILLA_EVIDENCE_STEP_SECONDS=30) and answers of
# 170-320 tokens, SmolLM2-135M Q4_1 on one thread (infra/local/modelserver.py THREADS):
# 26 s with other people's unit tests running, 25 s beside a `nice -n 19` busy loop, 74 s
# beside two busy loops at normal priority (both cores full: prompt read at 27 tokens/s,
# answer written at 14/s). 120 s is 1.6 x that worst case, 4.5 x the usual one.
LLM_TIMEOUT_SECONDS = 120.0
MAX_TOKENS = 320  # SmolLM2's decisions run 170-320 tokens; past this it rambles
LLM_SETTINGS = {
    "FLOTILLA_REASONER": "llm",
    "FLOTILLA_LLM_MODEL": "smollm2",
    "FLOTILLA_LLM_TIMEOUT_SECONDS": str(LLM_TIMEOUT_SECONDS),
    "FLOTILLA_LLM_MAX_RETRIES": "1",
    "FLOTILLA_LLM_MAX_TOKENS": str(MAX_TOKENS),
    # the p95 history every 30 s, not the local stack's 5 s: the same two minutes in 4
    # points per service instead of 24, a prompt of ~1.9k tokens instead of ~4.2k (its
    # reading is most of an answer's time on a CPU)
    "FLOTILLA_EVIDENCE_STEP_SECONDS": "30",
    # the model is slow next to the rules: give each decision time before a worker's lease lapses
    "FLOTILLA_DIAGNOSTIC_JOB_SECONDS": "1",
}


def stackctl(*args: str, timeout: float) -> str:
    done = subprocess.run([*STACKCTL, *args], capture_output=True, text=True, timeout=timeout)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        pytest.fail(f"stackctl {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


@dataclass(frozen=True)
class ModelServer:
    """The stack's model server, as the tests reach it."""

    base: str  # without /v1
    key_file: Path  # its API key (FLOTILLA_LLM_API_KEY_FILE)

    @property
    def url(self) -> str:
        return f"{self.base}/v1"

    def key(self) -> str:
        return self.key_file.read_text().strip()

    def models(self, key: str | None) -> int:
        """The status of GET /v1/models, with ``key`` as the bearer (None: no Authorization)."""
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{self.url}/models", headers=headers), timeout=3):
                return 200
        except urllib.error.HTTPError as exc:
            return exc.code

    def pid(self) -> int:
        done = subprocess.run([*STACKCTL, "pid", "model-server"], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0 and done.stdout.strip().isdigit(), done.stdout + done.stderr
        return int(done.stdout.strip())

    def wait_healthy(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.models(self.key()) == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the model server did not come back within {timeout:.0f}s")

    def restart(self) -> float:
        """Kill the server (whatever it is answering) and wait until supervisord has it back
        and its model loaded; returns the seconds that took."""
        t0 = time.monotonic()
        old = self.pid()
        os.kill(old, signal.SIGKILL)
        deadline = t0 + 60
        while True:  # supervisord notices the exit, then starts a new process
            assert time.monotonic() < deadline, "supervisord did not start the model server again"
            try:
                if self.pid() not in (0, old):
                    break
            except AssertionError:  # no pid while it is down
                pass
            time.sleep(0.1)
        self.wait_healthy()
        return time.monotonic() - t0


@pytest.fixture(scope="session")
def model_server(stack: StackSettings) -> ModelServer:
    """The model server, started (and built, the first time)."""
    t0 = time.monotonic()
    said = stackctl("model-up", timeout=1800)  # a cold build is ~6 min on 2 cores; allow a slow machine
    print(f"[model] model server up after {time.monotonic() - t0:.0f}s")
    key_file = said.rsplit("FLOTILLA_LLM_API_KEY_FILE=", 1)[1].split()[0]
    port = os.environ.get("FLOTILLA_MODEL_SERVER_PORT", "18122")
    return ModelServer(f"http://127.0.0.1:{port}", Path(key_file))


@pytest.fixture(scope="session")
def tap(model_server: ModelServer) -> Iterator[ModelTap]:
    with ModelTap(model_server.base, upstream_timeout=LLM_TIMEOUT_SECONDS + 5) as recording:
        yield recording
        # every exchange (requests, answers, timings), for whoever reads a failed run
        TAP_RECORD.parent.mkdir(parents=True, exist_ok=True)
        TAP_RECORD.write_text(json.dumps([dataclasses.asdict(e) for e in recording.exchanges], indent=1))
        took = sorted(e.seconds for e in recording.exchanges if e.forwarded and e.status == 200)
        print(f"[model] {len(recording.exchanges)} exchanges ({TAP_RECORD}); the server's answers took {took}")


@pytest.fixture(autouse=True)
def quiet_model_server(request: pytest.FixtureRequest) -> None:
    """Before each test that uses the model server: earlier tests' incidents are answered
    by the tap, and the server is restarted, so nothing a previous test left in flight
    holds it (one slot: a leftover answer delays every request behind it)."""
    if "model_server" not in request.fixturenames:
        return
    model_server: ModelServer = request.getfixturevalue("model_server")
    tap: ModelTap = request.getfixturevalue("tap")
    tap.isolate()
    forwarded = tap.forwarded_now()
    print(f"[model] server restarted in {model_server.restart():.1f}s ({forwarded} request(s) were at it)")


def start_fleet(tap: ModelTap, model_server: ModelServer, **overrides: str) -> dict[str, str]:
    env = {
        **os.environ,
        **E2E_SETTINGS,
        **LLM_SETTINGS,
        "FLOTILLA_LLM_BASE_URL": tap.url,
        "FLOTILLA_LLM_API_KEY_FILE": str(model_server.key_file),
        **overrides,
    }
    subprocess.run([*FLEETCTL, "down"], capture_output=True, timeout=180, env=env)
    started = subprocess.run([*FLEETCTL, "up"], capture_output=True, text=True, timeout=600, env=env)
    sys.stdout.write(started.stdout)
    if started.returncode != 0:
        pytest.fail(f"fleet did not come up:\n{started.stdout}\n{started.stderr}")
    return env


@pytest.fixture(scope="session")
def fleet(stack: StackSettings, serde: AvroSerde, tap: ModelTap, model_server: ModelServer) -> Iterator[Fleet]:
    env = start_fleet(tap, model_server)
    try:
        yield Fleet(stack, serde)
    finally:
        subprocess.run([*FLEETCTL, "down"], capture_output=True, timeout=180, env=env)


@pytest.fixture()
def watch(fleet: Fleet, tap: ModelTap) -> Iterator[Watch]:
    """A tail of incidents + commands from now on, the sim reset and the demo service settled;
    after the test, every incident it saw is an earlier test's for the tap."""
    with fleet.fresh_watch() as w:
        yield w
        tap.isolate(*{s.envelope.correlationid for s in w.seen})
