"""Run the Flotilla fleet locally: the sim and the seven services, supervised.

    python infra/local/fleetctl.py up|down|status [--json]

The fleet has its own supervisord (beside the stack's), so services can be restarted
without touching Kafka or PostgreSQL. ``up`` needs a running stack (``make stack-up``),
registers the contracts, starts every member and waits until each answers on its
``/readyz`` (the sim on ``/healthz``). Logs: ``.stack/logs/<service>.log``.

The fleet's secrets live in ``.stack/secrets/`` (a 0700 folder, every file 0600), made
the first time ``up`` runs and reused ever after, and each member gets only what it needs:

- the sim's action token (``FLOTILLA_SIM_ACTION_TOKEN``), shared by the sim and the
  executor only: the sim's action API admits nobody else;
- the policy service's command-signing key (``authorization-signing-key.pem``): only the
  policy service holds the file; the executor and the DLQ reconciler get its public key;
- the remediation agent's proposal-signing key (``proposal-signing-key.pem``): only the
  agent holds the file; the policy service gets its public key;
- the audit's chain-signing key (``.stack/audit/signing-key.pem``, where it always was):
  only the audit holds it, and its public key is the one key ``/verify`` trusts;
- the digest of the token the stack's Alertmanager presents to the health agent's
  webhook (``FLOTILLA_ALERT_TOKENS``; the token itself is the stack's, in
  ``alert-webhook-token``, and only Alertmanager reads it).

``sim-token-file``, ``secrets-dir`` and ``signing-key-file <member>`` print where they are,
for tests that act as a member.

Replicas: ``FLOTILLA_FLEET_REPLICAS=2`` runs two processes of every service with a
consumer loop (``executor=3,policy-service=2`` names them one by one). Replica ``i`` (from
0) is the program ``<name>`` or ``<name>-<i>``, listens on the member's port + 100·i and
is ``FLOTILLA_INSTANCE_ID=<name>-<i>``; all of them share the member's database and
consumer group, so Kafka spreads the partitions across them, and the executor's leases
keep one actor per resource. The sim and the console stay single.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pwd
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import stackctl  # same folder: run as a script, its folder is on sys.path
from stackctl import LOGS, STACK_HOME, StackError, Supervisor

from flotilla import stackcheck
from flotilla.bearer import token_digest
from flotilla.fleet import (
    AGENTS,
    AUDIT,
    CONSOLE,
    DLQ_RECONCILER,
    EXECUTOR,
    FLEET,
    HEALTH,
    POLICY,
    REMEDIATION,
    SIM,
    Member,
    url,
)
from flotilla.keys import KeyMaterialError, load_or_create, public_key_text
from flotilla.settings import load_settings

REPO_ROOT = Path(__file__).resolve().parents[2]

FLEET_RUN = STACK_HOME / "run" / "fleet"
SUPERVISOR = Supervisor(FLEET_RUN, "fleet", STACK_HOME)
START_TIMEOUT_S = float(os.environ.get("FLOTILLA_FLEET_TIMEOUT", "120"))
SECRETS_DIR = STACK_HOME / "secrets"
SIM_ACTION_TOKEN_FILE = SECRETS_DIR / "sim-action-token"
SIM_ACTION_TOKEN = "FLOTILLA_SIM_ACTION_TOKEN"
# The sim checks the token and the executor presents it; nobody else may hold it.
SIM_ACTION_TOKEN_HOLDERS = frozenset({SIM.name, EXECUTOR.name})
AUTHORIZATION_KEY_FILE = SECRETS_DIR / "authorization-signing-key.pem"
PROPOSAL_KEY_FILE = SECRETS_DIR / "proposal-signing-key.pem"
# Where the audit has always kept its key (services.audit.settings): an existing log stays
# signed by the key it was signed with.
AUDIT_KEY_FILE = STACK_HOME / "audit" / "signing-key.pem"
# flotilla.provenance: every member signs what it emits with its own key. The three that
# already sign something keep that one key; the others get one each here.
PRODUCER_KEY_FILES = {
    m.name: {POLICY: AUTHORIZATION_KEY_FILE, REMEDIATION: PROPOSAL_KEY_FILE, AUDIT: AUDIT_KEY_FILE}.get(
        m, SECRETS_DIR / "producers" / f"{m.name}-signing-key.pem"
    )
    for m in AGENTS
}
# Settings a member must get from the fleet's own secrets, never from the calling shell.
FLEET_SECRET_SETTINGS = frozenset(
    {
        SIM_ACTION_TOKEN,
        f"{SIM_ACTION_TOKEN}_FILE",  # the sim and the executor get the token itself, never a file of the shell's
        "FLOTILLA_AUTHORIZATION_SIGNING_KEY_FILE",
        "FLOTILLA_AUTHORIZATION_PUBLIC_KEYS",
        "FLOTILLA_PROPOSAL_SIGNING_KEY_FILE",
        "FLOTILLA_PROPOSAL_PUBLIC_KEYS",
        "FLOTILLA_AUDIT_SIGNING_KEY_FILE",
        "FLOTILLA_AUDIT_PUBLIC_KEYS",
        "FLOTILLA_ALERT_TOKENS",
        "FLOTILLA_SIGNING_KEY_FILE",
        "FLOTILLA_PRODUCER_KEYS",
    }
)


@dataclass(frozen=True)
class FleetSecrets:
    """What the fleet's members authenticate each other with."""

    sim_action_token: str
    authorization_key: Path  # the policy service's private key (file)
    authorization_public: str  # its public key, as keyrings take it
    proposal_key: Path  # the remediation agent's private key (file)
    proposal_public: str
    audit_key: Path  # the audit's private key (file): the hash chain's signatures
    audit_public: str
    alert_sender: str  # the digest of the token the stack's Alertmanager presents
    producer_public: dict[str, str]  # each member's public key (its private key: PRODUCER_KEY_FILES)

    @classmethod
    def ensure(cls) -> FleetSecrets:
        """Made the first time, reused after: a member restarted alone keeps its peers' trust."""
        keys = {}
        # flotilla.keys logs each key it generates; fleetctl says so itself, once, below.
        logging.getLogger("flotilla.keys").setLevel(logging.ERROR)
        for path in (AUTHORIZATION_KEY_FILE, PROPOSAL_KEY_FILE, AUDIT_KEY_FILE, *PRODUCER_KEY_FILES.values()):
            if path in keys:
                continue
            try:
                key, created = load_or_create(path)
            except KeyMaterialError as exc:
                raise StackError(f"{exc}: delete it and `up` makes a new one") from None
            if created:
                _say(f"generated {path.name} in {path.parent}")
            keys[path] = public_key_text(key.public_key())
        return cls(
            sim_action_token=sim_action_token(),
            authorization_key=AUTHORIZATION_KEY_FILE,
            authorization_public=keys[AUTHORIZATION_KEY_FILE],
            proposal_key=PROPOSAL_KEY_FILE,
            proposal_public=keys[PROPOSAL_KEY_FILE],
            audit_key=AUDIT_KEY_FILE,
            audit_public=keys[AUDIT_KEY_FILE],
            alert_sender=token_digest(
                stackctl.ensure_private_token(stackctl.ALERT_WEBHOOK_TOKEN_FILE, what="the alert webhook's token")
            ),
            producer_public={name: keys[path] for name, path in PRODUCER_KEY_FILES.items()},
        )

    def for_member(self, member: Member) -> dict[str, str]:
        """The secret settings of one member: each holds only what its job needs."""
        env: dict[str, str] = {}
        if member.name in SIM_ACTION_TOKEN_HOLDERS:
            env[SIM_ACTION_TOKEN] = self.sim_action_token
        if member is POLICY:
            env["FLOTILLA_AUTHORIZATION_SIGNING_KEY_FILE"] = str(self.authorization_key)
            env["FLOTILLA_PROPOSAL_PUBLIC_KEYS"] = json.dumps([self.proposal_public])
        if member in (EXECUTOR, DLQ_RECONCILER):
            env["FLOTILLA_AUTHORIZATION_PUBLIC_KEYS"] = json.dumps([self.authorization_public])
        if member is REMEDIATION:
            env["FLOTILLA_PROPOSAL_SIGNING_KEY_FILE"] = str(self.proposal_key)
        if member is AUDIT:
            env["FLOTILLA_AUDIT_SIGNING_KEY_FILE"] = str(self.audit_key)
            env["FLOTILLA_AUDIT_PUBLIC_KEYS"] = json.dumps([self.audit_public])
        if member.name in PRODUCER_KEY_FILES:
            env["FLOTILLA_SIGNING_KEY_FILE"] = str(PRODUCER_KEY_FILES[member.name])
            env["FLOTILLA_PRODUCER_KEYS"] = json.dumps({name: [key] for name, key in self.producer_public.items()})
        if member is HEALTH:
            env["FLOTILLA_ALERT_TOKENS"] = json.dumps([{"name": "alertmanager", "sha256": self.alert_sender}])
        return env


def _say(msg: str) -> None:
    print(f"[fleet] {msg}", flush=True)


REPLICAS = "FLOTILLA_FLEET_REPLICAS"
SINGLE = frozenset({SIM.name, CONSOLE.name})  # the pretend production, and sessions held in one process
REPLICA_PORT_STEP = 100
MAX_REPLICAS = 8  # per member; also bounds the programs running_instances looks for


@dataclass(frozen=True)
class Instance:
    """One process of a member: replica ``index`` of ``member``."""

    member: Member
    index: int

    @property
    def program(self) -> str:
        return self.member.name if self.index == 0 else f"{self.member.name}-{self.index}"

    @property
    def port(self) -> int:
        return self.member.http_port + REPLICA_PORT_STEP * self.index

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def replica_counts(text: str | None) -> dict[str, int]:
    """``FLOTILLA_FLEET_REPLICAS``: a count for every service with a consumer loop (``2``),
    or per member (``executor=3,policy-service=2``); unnamed members run one process."""
    counts = {m.name: 1 for m in FLEET}
    if not text or not text.strip():
        return counts
    spec = text.strip()
    pairs = (
        [(m.name, spec) for m in FLEET if m.name not in SINGLE]
        if "=" not in spec
        else [tuple(part.split("=", 1)) for part in spec.split(",") if part.strip()]
    )
    for name, count in pairs:
        name, count = name.strip(), str(count).strip()
        if name not in counts:
            raise StackError(f"{REPLICAS}: no fleet member named {name!r}; members: {', '.join(counts)}")
        if not count.isdigit() or not 1 <= int(count) <= MAX_REPLICAS:
            raise StackError(f"{REPLICAS}: {name}={count} is not a replica count from 1 to {MAX_REPLICAS}")
        if name in SINGLE and int(count) != 1:
            raise StackError(f"{REPLICAS}: {name} runs as one process (it has no consumer group to share)")
        counts[name] = int(count)
    return counts


def running_instances() -> list[Instance]:
    """The processes of the fleet as it runs (its supervisor's programs), else as configured."""
    programs = set(SUPERVISOR.states())
    if not programs:
        return instances()
    by_program = {Instance(m, i).program: Instance(m, i) for m in FLEET for i in range(MAX_REPLICAS)}
    return [by_program[p] for p in by_program if p in programs]


def instances(counts: dict[str, int] | None = None) -> list[Instance]:
    """Every process of the fleet, members in fleet order, replicas in index order."""
    counts = counts if counts is not None else replica_counts(os.environ.get(REPLICAS))
    return [Instance(m, i) for m in FLEET for i in range(counts[m.name])]


def sim_action_token(path: Path = SIM_ACTION_TOKEN_FILE) -> str:
    """The local fleet's sim action token, made once and reused (stackctl.ensure_private_token):
    a member restarted alone still holds the token its peer has."""
    return stackctl.ensure_private_token(path, what="the sim's action token", say=_say)


def member_env(member: Member, fleet_secrets: FleetSecrets, index: int = 0) -> dict[str, str]:
    """The environment of one member's process (replica ``index``): the stack's settings
    plus its own, and the fleet's secrets that member holds (:meth:`FleetSecrets.for_member`)."""
    instance = Instance(member, index)
    env = {
        "FLOTILLA_ENV_FILE": str(stackctl.ENV_FILE),
        "FLOTILLA_SERVICE_NAME": member.name,
        "FLOTILLA_HTTP_PORT": str(instance.port),
        "FLOTILLA_SIM_PORT": str(FLEET[0].http_port),
        "FLOTILLA_SIM_URL": url(FLEET[0]),
        "PYTHONUNBUFFERED": "1",
    }
    if member.database:
        env["FLOTILLA_SERVICE_DATABASE"] = member.database
    if index:
        env["FLOTILLA_INSTANCE_ID"] = instance.program
    env.update(fleet_secrets.for_member(member))
    # Demo-friendly defaults an operator can override from the calling environment (not
    # the fleet's secrets: those are its own files, and every member would get them).
    # OpenTelemetry's OTEL_* too (flotilla.tracing), but not OTEL_SERVICE_NAME: each
    # member is named after itself.
    for key, value in os.environ.items():
        passed = key.startswith("FLOTILLA_") or (key.startswith("OTEL_") and key != "OTEL_SERVICE_NAME")
        if passed and key not in env and key not in FLEET_SECRET_SETTINGS:
            env[key] = value
    if env.get("FLOTILLA_REASONER") == "llm":  # unless told otherwise, the stack's model server
        env.setdefault("FLOTILLA_LLM_BASE_URL", stackctl.MODEL_SERVER.url)
        env.setdefault("FLOTILLA_LLM_MODEL", stackctl.MODEL_ALIAS)
        if env["FLOTILLA_LLM_BASE_URL"] == stackctl.MODEL_SERVER.url:  # and its key, by file
            stackctl.model_server_key()
            env.setdefault("FLOTILLA_LLM_API_KEY_FILE", str(stackctl.MODEL_SERVER.key_file))
    return env


def _quoted(key: str, value: str) -> str:
    """A value for supervisord's ``environment=``: it splits on commas outside quotes,
    has no escapes, and strips the quotes it finds at either end; its config also
    interpolates ``%``. So: double quotes, or single quotes around a value holding
    double quotes (JSON), and ``%`` doubled."""
    value = value.replace("%", "%%")
    if '"' not in value:
        return f'"{value}"'
    if "'" not in value and not value.endswith(('"', "'")):
        return f"'{value}'"
    raise StackError(f"{key} cannot be passed through supervisord (it mixes quote characters); use a file setting")


def _config(fleet_secrets: FleetSecrets, processes: list[Instance] | None = None) -> str:
    parts = [SUPERVISOR.header(LOGS, pwd.getpwuid(os.geteuid()).pw_name)]
    for instance in processes if processes is not None else instances():
        member = instance.member
        env = ",".join(f"{k}={_quoted(k, v)}" for k, v in member_env(member, fleet_secrets, instance.index).items())
        parts.append(
            f"""
[program:{instance.program}]
command={sys.executable} -m {member.module}
directory={REPO_ROOT}
autostart=false
autorestart=true
startsecs=1
stopsignal=TERM
stopwaitsecs=30
redirect_stderr=true
stdout_logfile={LOGS / (instance.program + ".log")}
environment={env}
"""
        )
    return "".join(parts)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a file only its owner can read (it holds the action token): a
    fresh file made 0600, never an older one whose mode let others in."""
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
        out.write(text)


def ready(member: Member | Instance) -> bool:
    instance = member if isinstance(member, Instance) else Instance(member, 0)
    path = "/healthz" if instance.member.database is None else "/readyz"
    try:
        with urllib.request.urlopen(instance.url + path, timeout=2) as resp:
            return bool(resp.status == 200)
    except Exception:
        return False


def _wait_ready(instance: Instance) -> None:
    SUPERVISOR.wait_until_up(
        instance.program,
        lambda: ready(instance),
        endpoint=instance.url,
        log=LOGS / f"{instance.program}.log",
        timeout=START_TIMEOUT_S,
        interval=0.3,
    )


def up() -> None:
    started = time.monotonic()
    down_parts = stackcheck.problems(load_settings(stackctl.ENV_FILE)) if stackctl.ENV_FILE.exists() else {"all": "-"}
    if down_parts:
        raise StackError(f"the stack is not up ({', '.join(down_parts)}): run `make stack-up` first")
    subprocess.run([sys.executable, "-m", "flotilla.schemas"], check=True, capture_output=True, cwd=REPO_ROOT)
    processes = instances()
    already = SUPERVISOR.running()
    if not already:
        for instance in processes:
            if stackctl._port_in_use(instance.port):
                raise StackError(
                    f"port {instance.port} for {instance.program} is held by "
                    f"{stackctl._port_holder(instance.port)}, not by this fleet"
                )
        FLEET_RUN.mkdir(parents=True, exist_ok=True)
        write_private(SUPERVISOR.conf, _config(FleetSecrets.ensure(), processes))
        SUPERVISOR.launch(LOGS / "supervisord-fleet-start.log")
    states = SUPERVISOR.states()
    missing = [i.program for i in processes if i.program not in states]
    if already and missing:
        raise StackError(
            f"the running fleet has no {', '.join(missing)} (started with other replicas): run `make fleet-down` first"
        )
    to_start = [i.program for i in processes if states.get(i.program) != "RUNNING"]
    if to_start:
        SUPERVISOR.ctl("start", *to_start, check=False)
    for instance in processes:
        _wait_ready(instance)
        _say(f"{instance.program:<20} ready on {instance.url}")
    _say(f"fleet up in {time.monotonic() - started:.1f}s; logs in {LOGS}")


def down() -> None:
    if not SUPERVISOR.running():
        _say("fleet is not running")
        return
    SUPERVISOR.shutdown(list(reversed(SUPERVISOR.states())))
    _say("fleet stopped")


def stop(service: str | None) -> None:
    """Stop one fleet process (the rest keep running), e.g. all but the sim for a benchmark."""
    chosen = [i for i in running_instances() if i.program == service]
    if not chosen:
        names = ", ".join(i.program for i in running_instances())
        raise StackError(f"stop needs one fleet process, not {service!r}; processes: {names}")
    SUPERVISOR.ctl("stop", chosen[0].program)
    _say(f"stopped {chosen[0].program}")


def restart(service: str | None) -> None:
    """Restart one member (or all) and wait until it is ready again."""
    chosen = [i for i in running_instances() if service in (None, i.program)]
    if not chosen:
        names = ", ".join(i.program for i in running_instances())
        raise StackError(f"no fleet process named {service!r}; processes: {names}")
    SUPERVISOR.ctl("restart", *[i.program for i in chosen])
    for instance in chosen:
        _wait_ready(instance)
    _say(f"restarted {', '.join(i.program for i in chosen)}")


def status(as_json: bool) -> int:
    states = SUPERVISOR.states()
    rows = [
        {
            "service": i.program,
            "state": "up" if ready(i) else "down",
            "supervisor": states.get(i.program, "-"),
            "endpoint": i.url,
            "database": i.member.database or "-",
            "log": str(LOGS / f"{i.program}.log"),
        }
        for i in running_instances()
    ]
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['service']:<18} {r['state']:<5} {r['endpoint']:<24} {r['database']:<22} {r['log']}")
    return 0 if all(r["state"] == "up" for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "action",
        choices=["up", "down", "status", "restart", "stop", "pid", "sim-token-file", "secrets-dir", "signing-key-file"],
    )
    parser.add_argument("service", nargs="?", help="with restart, stop, pid or signing-key-file: one member")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            up()
        elif args.action == "down":
            down()
        elif args.action == "restart":
            restart(args.service)
        elif args.action == "stop":
            stop(args.service)
        elif args.action == "pid":
            print(SUPERVISOR.ctl("pid", args.service or "all").strip())
        elif args.action == "sim-token-file":
            print(SIM_ACTION_TOKEN_FILE)
        elif args.action == "secrets-dir":
            print(SECRETS_DIR)
        elif args.action == "signing-key-file":
            if args.service not in PRODUCER_KEY_FILES:
                raise StackError(f"signing-key-file needs a member that signs: {', '.join(PRODUCER_KEY_FILES)}")
            print(PRODUCER_KEY_FILES[args.service])
        else:
            return status(args.json)
    except StackError as exc:
        print(f"[fleet] ERROR: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
