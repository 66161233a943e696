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
  only the audit holds it, and its public key is the one key ``/verify`` trusts.

``sim-token-file`` and ``secrets-dir`` print where they are, for tests that act as a member.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import secrets
import stat
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import stackctl  # same folder: run as a script, its folder is on sys.path
from stackctl import LOGS, STACK_HOME, StackError, Supervisor

from flotilla import stackcheck
from flotilla.fleet import AUDIT, DLQ_RECONCILER, EXECUTOR, FLEET, POLICY, REMEDIATION, SIM, Member, url
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
# Settings a member must get from the fleet's own secrets, never from the calling shell.
FLEET_SECRET_SETTINGS = frozenset(
    {
        SIM_ACTION_TOKEN,
        "FLOTILLA_AUTHORIZATION_SIGNING_KEY_FILE",
        "FLOTILLA_AUTHORIZATION_PUBLIC_KEYS",
        "FLOTILLA_PROPOSAL_SIGNING_KEY_FILE",
        "FLOTILLA_PROPOSAL_PUBLIC_KEYS",
        "FLOTILLA_AUDIT_SIGNING_KEY_FILE",
        "FLOTILLA_AUDIT_PUBLIC_KEYS",
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

    @classmethod
    def ensure(cls) -> FleetSecrets:
        """Made the first time, reused after: a member restarted alone keeps its peers' trust."""
        keys = {}
        for path in (AUTHORIZATION_KEY_FILE, PROPOSAL_KEY_FILE, AUDIT_KEY_FILE):
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
        return env


def _say(msg: str) -> None:
    print(f"[fleet] {msg}", flush=True)


def sim_action_token(path: Path = SIM_ACTION_TOKEN_FILE) -> str:
    """The local fleet's sim action token: 32 random bytes, made once and then reused, so
    a member restarted alone still holds the token its peer has. Mode 0600 in a 0700
    folder: other users of the machine can reach the loopback sim, but not read this."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise StackError(
                f"{path} is readable by other users (mode {mode:o}): delete it (a new token is made on `up`) "
                "or chmod 600 it if nobody else can have read it"
            ) from None
        token = path.read_text().strip()
        if not token:
            raise StackError(f"{path} is empty: delete it and `up` makes a new token") from None
        return token
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    _say(f"generated the sim's action token in {path}")
    return token


def member_env(member: Member, fleet_secrets: FleetSecrets) -> dict[str, str]:
    """The environment of one member's process: the stack's settings plus its own, and
    the fleet's secrets that member holds (:meth:`FleetSecrets.for_member`)."""
    env = {
        "FLOTILLA_ENV_FILE": str(stackctl.ENV_FILE),
        "FLOTILLA_SERVICE_NAME": member.name,
        "FLOTILLA_HTTP_PORT": str(member.http_port),
        "FLOTILLA_SIM_PORT": str(FLEET[0].http_port),
        "FLOTILLA_SIM_URL": url(FLEET[0]),
        "PYTHONUNBUFFERED": "1",
    }
    if member.database:
        env["FLOTILLA_SERVICE_DATABASE"] = member.database
    env.update(fleet_secrets.for_member(member))
    # Demo-friendly defaults an operator can override from the calling environment (not
    # the fleet's secrets: those are its own files, and every member would get them).
    # OpenTelemetry's OTEL_* too (flotilla.tracing), but not OTEL_SERVICE_NAME: each
    # member is named after itself.
    for key, value in os.environ.items():
        passed = key.startswith("FLOTILLA_") or (key.startswith("OTEL_") and key != "OTEL_SERVICE_NAME")
        if passed and key not in env and key not in FLEET_SECRET_SETTINGS:
            env[key] = value
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


def _config(fleet_secrets: FleetSecrets) -> str:
    parts = [SUPERVISOR.header(LOGS, pwd.getpwuid(os.geteuid()).pw_name)]
    for member in FLEET:
        env = ",".join(f"{k}={_quoted(k, v)}" for k, v in member_env(member, fleet_secrets).items())
        parts.append(
            f"""
[program:{member.name}]
command={sys.executable} -m {member.module}
directory={REPO_ROOT}
autostart=false
autorestart=true
startsecs=1
stopsignal=TERM
stopwaitsecs=30
redirect_stderr=true
stdout_logfile={LOGS / (member.name + ".log")}
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


def ready(member: Member) -> bool:
    path = "/healthz" if member.database is None else "/readyz"
    try:
        with urllib.request.urlopen(url(member) + path, timeout=2) as resp:
            return bool(resp.status == 200)
    except Exception:
        return False


def _wait_ready(member: Member) -> None:
    SUPERVISOR.wait_until_up(
        member.name,
        lambda: ready(member),
        endpoint=url(member),
        log=LOGS / f"{member.name}.log",
        timeout=START_TIMEOUT_S,
        interval=0.3,
    )


def up() -> None:
    started = time.monotonic()
    down_parts = stackcheck.problems(load_settings(stackctl.ENV_FILE)) if stackctl.ENV_FILE.exists() else {"all": "-"}
    if down_parts:
        raise StackError(f"the stack is not up ({', '.join(down_parts)}): run `make stack-up` first")
    subprocess.run([sys.executable, "-m", "flotilla.contracts"], check=True, capture_output=True, cwd=REPO_ROOT)
    if not SUPERVISOR.running():
        for member in FLEET:
            if stackctl._port_in_use(member.http_port):
                raise StackError(
                    f"port {member.http_port} for {member.name} is held by "
                    f"{stackctl._port_holder(member.http_port)}, not by this fleet"
                )
        FLEET_RUN.mkdir(parents=True, exist_ok=True)
        write_private(SUPERVISOR.conf, _config(FleetSecrets.ensure()))
        SUPERVISOR.launch(LOGS / "supervisord-fleet-start.log")
    states = SUPERVISOR.states()
    to_start = [m for m in FLEET if states.get(m.name) != "RUNNING"]
    if to_start:
        SUPERVISOR.ctl("start", *[m.name for m in to_start], check=False)
    for member in FLEET:
        _wait_ready(member)
        _say(f"{member.name:<18} ready on {url(member)}")
    _say(f"fleet up in {time.monotonic() - started:.1f}s; logs in {LOGS}")


def down() -> None:
    if not SUPERVISOR.running():
        _say("fleet is not running")
        return
    SUPERVISOR.shutdown([m.name for m in reversed(FLEET)])
    _say("fleet stopped")


def restart(service: str | None) -> None:
    """Restart one member (or all) and wait until it is ready again."""
    members = [m for m in FLEET if service in (None, m.name)]
    if not members:
        raise StackError(f"no fleet member named {service!r}; members: {', '.join(m.name for m in FLEET)}")
    SUPERVISOR.ctl("restart", *[m.name for m in members])
    for member in members:
        _wait_ready(member)
    _say(f"restarted {', '.join(m.name for m in members)}")


def status(as_json: bool) -> int:
    states = SUPERVISOR.states()
    rows = [
        {
            "service": m.name,
            "state": "up" if ready(m) else "down",
            "supervisor": states.get(m.name, "-"),
            "endpoint": url(m),
            "database": m.database or "-",
            "log": str(LOGS / f"{m.name}.log"),
        }
        for m in FLEET
    ]
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['service']:<18} {r['state']:<5} {r['endpoint']:<24} {r['database']:<22} {r['log']}")
    return 0 if all(r["state"] == "up" for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down", "status", "restart", "pid", "sim-token-file", "secrets-dir"])
    parser.add_argument("service", nargs="?", help="with restart or pid: one member")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            up()
        elif args.action == "down":
            down()
        elif args.action == "restart":
            restart(args.service)
        elif args.action == "pid":
            print(SUPERVISOR.ctl("pid", args.service or "all").strip())
        elif args.action == "sim-token-file":
            print(SIM_ACTION_TOKEN_FILE)
        elif args.action == "secrets-dir":
            print(SECRETS_DIR)
        else:
            return status(args.json)
    except StackError as exc:
        print(f"[fleet] ERROR: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
