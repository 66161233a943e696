# Flotilla — `make help` lists every target.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON_BOOT ?= python3.11
VENV        := .venv
PY          := $(VENV)/bin/python
STACKCTL    := $(PY) infra/local/stackctl.py
STAMP       := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: help install lock demo demo-outbox fleet-up fleet-down model-up model-down fleet-status stack-up stack-down stack-reset stack-status schemas check test test-unit test-model test-integration test-k8s test-compose test-transforms browser lint format records bench-outbox bench-hops bench-detection bench-runaway bench-idle bench-authority bench-storm bench-eval chaos clean

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-17s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml constraints.txt
	@command -v $(PYTHON_BOOT) >/dev/null || { echo "error: $(PYTHON_BOOT) not found; Flotilla needs Python 3.11" >&2; exit 2; }
	@echo "[setup] .venv: Python 3.11 with the pinned dependencies of constraints.txt (a minute or two, first run only)"
	@$(PYTHON_BOOT) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@# PYTHONWARNINGS: setuptools reminds every editable install that a folder named like a
	@# package (services/) shadows it; here that is the point, so the reminder is noise.
	@PYTHONWARNINGS=ignore::UserWarning $(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	@touch $(STAMP)
	@echo "[setup] .venv ready"

install: $(STAMP) ## Create .venv and install Flotilla with its pinned dependencies

lock: ## Re-resolve pyproject.toml's pins in a scratch venv and write constraints.txt
	rm -rf .lock-venv && $(PYTHON_BOOT) -m venv .lock-venv
	.lock-venv/bin/python -m pip install -q --upgrade pip
	.lock-venv/bin/python -m pip install -q ".[dev]"
	{ sed -n '/^#/p' constraints.txt; .lock-venv/bin/python -m pip freeze --exclude flotilla; } > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf .lock-venv

# DEMO_REASONER=llm: both agents reason through the local model server (started first).
demo: $(if $(filter llm,$(DEMO_REASONER)),model-up) fleet-up ## Main job: a full local incident, from a slow service to a verified recovery, live
	@$(PY) infra/local/demo.py

demo-outbox: stack-up schemas ## The outbox round trip alone, shown live
	$(PY) infra/local/outbox_demo.py

fleet-up: stack-up schemas ## Start the sim and the seven services (needs the stack)
	@$(if $(filter llm,$(DEMO_REASONER)),FLOTILLA_REASONER=llm) $(PY) infra/local/fleetctl.py up

model-up: stack-up ## Start the local model server (llama-cpp-python + SmolLM2; built on first use, ~6 min)
	@$(STACKCTL) model-up

model-down: $(STAMP) ## Stop the local model server (the stack keeps running)
	@$(STACKCTL) model-down

fleet-down: $(STAMP) ## Stop the fleet (the stack keeps running)
	$(PY) infra/local/fleetctl.py down

fleet-status: $(STAMP) ## Each service: up/down, endpoint, database, log file
	$(PY) infra/local/fleetctl.py status

stack-up: $(STAMP) ## Start the local stack (idempotent; downloads on first run)
	@$(STACKCTL) up

stack-down: $(STAMP) ## Stop the local stack, keeping its data
	$(STACKCTL) down

stack-reset: $(STAMP) ## Stop the local stack and wipe its data
	$(STACKCTL) reset

stack-status: $(STAMP) ## Each component: up/down, endpoint, version, log file
	$(STACKCTL) status

schemas: $(STAMP) ## Register every contract in schemas/ with the registry
	@$(PY) -m flotilla.schemas --quiet

lint: $(STAMP) ## ruff (lint + format check), mypy, the import layers (pyproject [tool.importlinter]), current typed records
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/python -m flotilla_ops.genrecords --check
	$(VENV)/bin/python -m flotilla_ops.gencedar --check

records: $(STAMP) ## Regenerate libs/flotilla/records.py (the typed records) from schemas/, and the command kinds' Cedar actions from libs/flotilla/actions
	$(VENV)/bin/python -m flotilla_ops.genrecords
	$(VENV)/bin/python -m flotilla_ops.gencedar

format: $(STAMP) ## Apply ruff's formatting and safe fixes
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

CHROMIUM    ?= /usr/bin/chromium

browser: ## Debian's chromium for the web console's browser test (installed when missing; needs root)
	@test -x $(CHROMIUM) || { \
	  [ "$$(id -u)" = 0 ] || { echo "error: $(CHROMIUM) is missing; run: sudo apt-get install -y chromium" >&2; exit 2; }; \
	  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null; }
	@$(CHROMIUM) --version

check: lint test-unit ## The fast lane: lint and the unit tests, no stack (what pre-commit runs, and CI first)

test: check browser test-transforms ## The fast lane first, then JUnit, every test on the real stack, the Kubernetes lane, the model lane, a short chaos soak, and the compose lane (it stops the local stack)
	$(VENV)/bin/pytest tests/integration tests/e2e $(PYTEST_ARGS)
	$(VENV)/bin/pytest tests/k8s $(PYTEST_ARGS)
	$(VENV)/bin/pytest tests/model -s $(PYTEST_ARGS)
	$(VENV)/bin/pytest tests/chaos -s $(PYTEST_ARGS)
	$(VENV)/bin/pytest tests/compose -s $(PYTEST_ARGS)

test-unit: $(STAMP) ## Only the fast unit tests (no stack)
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

test-model: $(STAMP) ## Only the model lane: incidents and the evaluation suite through the local model server (built on first use)
	$(VENV)/bin/pytest tests/model -s $(PYTEST_ARGS)

test-k8s: $(STAMP) ## Only the Kubernetes lane: manifests, RBAC, the executor's target, the Kubernetes evidence on a real API server (built on first use)
	$(VENV)/bin/pytest tests/k8s $(PYTEST_ARGS)

test-compose: $(STAMP) ## Only the compose lane: docker compose up on a Docker engine (installed if missing), an incident approved with the CLI
	$(VENV)/bin/pytest tests/compose -s $(PYTEST_ARGS)

# The one-node cluster (infra/k8s/cluster/clusterctl.py; docs/operations/cluster.md): root, built on first use.
.PHONY: cluster-up cluster-down test-cluster
cluster-up: $(STAMP) ## Start a one-node Kubernetes cluster that runs pods, in namespaces of its own (built on first use; root)
	@$(PY) infra/k8s/cluster/clusterctl.py up

cluster-down: $(STAMP) ## Stop the one-node cluster and remove every trace of it from the machine
	@$(PY) infra/k8s/cluster/clusterctl.py down

test-cluster: $(STAMP) ## Only the cluster lane: the base (pods, Service DNS, logs, port-forward, a clean teardown), the workload and its faults, the fleet deployed by its own manifests
	@$(PY) infra/k8s/cluster/clusterctl.py build
	@$(PY) infra/k8s/cluster/workload/workload.py build
	$(VENV)/bin/pytest tests/cluster -s $(PYTEST_ARGS)

test-integration: $(STAMP) ## Only the tests on the real stack
	$(VENV)/bin/pytest tests/integration $(PYTEST_ARGS)

test-transforms: ## JUnit tests of our Kafka Connect transforms, and their jar (Maven; add MVN_ARGS=-o offline)
	mvn -B -q $(MVN_ARGS) -f infra/connect-transforms/pom.xml verify

bench-outbox: stack-up schemas ## Outbox-commit -> consumer latency over 1,000 rows (p50/p99)
	$(PY) benchmarks/outbox_latency.py --rows 1000 --pause-ms 100

bench-hops: stack-up schemas ## Where one hop's time goes: p50/p99 of each stage, outbox commit -> consumer commit, beside the floor
	$(PY) benchmarks/hop_stages.py --rows 300

bench-detection: fleet-up ## Fault -> incident through the sim's /metrics, Prometheus and Alertmanager, in one run
	$(PY) benchmarks/detection_latency.py --faults $${DETECTION_FAULTS:-10}

bench-runaway: stack-up schemas ## The runaway storm: 100 ping-pong loops at once, each cut by the hop budget
	$(PY) benchmarks/runaway_storm.py --loops 100

chaos: stack-up schemas ## The long chaos soak: 1,000 incidents under a SIGKILL every 4 s (report in .stack/chaos/report.json)
	CHAOS_INCIDENTS=$${CHAOS_INCIDENTS:-1000} CHAOS_INJECT_PER_SECOND=$${CHAOS_INJECT_PER_SECOND:-4} \
	  CHAOS_KILL_EVERY_SECONDS=$${CHAOS_KILL_EVERY_SECONDS:-4} CHAOS_POISON=$${CHAOS_POISON:-20} \
	  CHAOS_DRAIN_SECONDS=$${CHAOS_DRAIN_SECONDS:-1800} CHAOS_TIMEOUT_SECONDS=$${CHAOS_TIMEOUT_SECONDS:-7200} \
	  CHAOS_READ_SECONDS=$${CHAOS_READ_SECONDS:-5} \
	  $(VENV)/bin/pytest tests/chaos -s $(PYTEST_ARGS)

bench-storm: stack-up schemas ## K services breach at once (K=50, 200; R=1, 2), beside DBOS Transact doing the same 7 steps
	$(PY) benchmarks/storm.py --faults $${STORM_FAULTS:-50,200} --replicas $${STORM_REPLICAS:-1,2}

bench-idle: fleet-up ## What the idle fleet costs: CPU (% of a core) and memory per component, over a minute
	$(PY) benchmarks/idle_footprint.py --seconds 60

bench-authority: $(STAMP) ## What signing and verifying commands and proposals cost (no stack)
	$(PY) benchmarks/authority.py

EVAL_ARGS ?=

bench-eval: $(STAMP) ## Score the rules reasoner (and the model in FLOTILLA_LLM_* when set) on the evaluation suite
	$(VENV)/bin/flotilla eval --reasoner rules $(EVAL_ARGS)
	@if [ -n "$$FLOTILLA_LLM_BASE_URL" ] && [ -n "$$FLOTILLA_LLM_MODEL" ]; then \
	  echo "[bench-eval] $$FLOTILLA_LLM_MODEL at $$FLOTILLA_LLM_BASE_URL"; \
	  $(VENV)/bin/flotilla eval --reasoner llm $(EVAL_ARGS); \
	else echo "[bench-eval] FLOTILLA_LLM_BASE_URL / FLOTILLA_LLM_MODEL unset: only the rules reasoner was scored"; fi

clean: ## Remove the virtualenv and caches (keeps .stack; see stack-reset)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
