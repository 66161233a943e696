# syntax=docker/dockerfile:1
#
# One image for the whole Flotilla fleet. Every member runs from it as
# `python -m <module>` (the `module` column of libs/flotilla/fleet.py), chosen by the
# container's command; docker-compose.yml and the Kubernetes manifests do exactly that.
#
#   docker build -t flotilla/flotilla:0.1.0 .
#   docker run --rm flotilla/flotilla:0.1.0                       # the sim (needs nothing)
#   docker run --rm flotilla/flotilla:0.1.0 python -m services.executor   # needs FLOTILLA_* settings
#
# builder: the project's pinned dependencies, then the project itself as a wheel, into a
#          virtualenv at /opt/flotilla (dependencies in their own layer: they change rarely).
# runtime: python:3.11-slim, the virtualenv, the contracts (schemas/), the Cedar policies
#          (infra/policies/) and the demo script, as user 10001. No compiler, no secrets:
#          every setting arrives as a FLOTILLA_* variable at run time (docs/operations/compose.md).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------- builder
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/flotilla
WORKDIR /src

# The dependencies pinned in pyproject.toml ([project].dependencies), without the dev
# extras, each transitive one at the version the tests ran with (constraints.txt).
COPY pyproject.toml README.md constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && /opt/flotilla/bin/pip install --requirement /tmp/requirements.txt --constraint constraints.txt

# The project: flotilla (libs/flotilla), the operator tools (libs/flotilla_ops) and the
# services, with their package data (each service's migrations.sql).
COPY libs ./libs
COPY services ./services
RUN /opt/flotilla/bin/pip install --no-deps . \
    && /opt/flotilla/bin/python -c "import flotilla.runner, flotilla.fleet"

# ---------------------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime

ARG FLOTILLA_UID=10001
RUN groupadd --system --gid ${FLOTILLA_UID} flotilla \
    && useradd --system --uid ${FLOTILLA_UID} --gid ${FLOTILLA_UID} --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin flotilla \
    && install -d -o ${FLOTILLA_UID} -g ${FLOTILLA_UID} -m 0700 /var/lib/flotilla /var/lib/flotilla/audit \
        /var/lib/flotilla/keys /var/lib/flotilla/keys/authorization /var/lib/flotilla/keys/proposal \
        /var/lib/flotilla/keys/public /var/lib/flotilla/sim-token \
        /var/lib/flotilla/keys/health-agent /var/lib/flotilla/keys/diagnostic-agent \
        /var/lib/flotilla/keys/executor /var/lib/flotilla/keys/dlq-reconciler

COPY --from=builder /opt/flotilla /opt/flotilla

WORKDIR /app
# Read at run time from these paths (the installed packages cannot find the repository's
# folders next to themselves): the contracts for `python -m flotilla.schemas` and
# `python -m flotilla.provision`, the policies for the policy service, the demo for the
# one-shot `incident` job of docker compose.
COPY schemas ./schemas
COPY infra/policies ./infra/policies
COPY infra/local/demo.py ./infra/local/demo.py

ENV PATH=/opt/flotilla/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    FLOTILLA_SCHEMAS_DIR=/app/schemas \
    FLOTILLA_POLICY_DIR=/app/infra/policies

USER 10001:10001

# The fleet's HTTP ports (libs/flotilla/fleet.py): 18101-18108 and the sim's 18110.
EXPOSE 18101-18110

CMD ["python", "-m", "services.sim"]
