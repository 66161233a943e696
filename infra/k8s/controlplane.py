"""A real Kubernetes control plane on 127.0.0.1, built here from the Go module proxy.

The "envtest" set-up that Kubernetes controller projects test against, plus the
controller manager: etcd, kube-apiserver and kube-controller-manager, and a kubectl of
the same version. No kubelet and no scheduler run, so a Deployment gets its ReplicaSets
and its rollout history, and its pods are created but never scheduled.

Built once (about 8 minutes on 2 cores), from a scratch Go module that requires
``k8s.io/kubernetes`` and pins each of its ``./staging`` modules to the published
``v0.X.Y`` of the same release; etcd from a three-line main calling ``etcdmain.Main``.
The binaries are kept under ``.stack/k8s/bin`` (keyed by version), Go's module and build
caches where Go keeps them (``go env GOMODCACHE GOCACHE``), so another clone on the
same machine builds in seconds.

Started with TLS (a CA made here), a static admin token, RBAC and service-account token
signing, on fixed ports (``FLOTILLA_K8S_PORT``, default 18443; etcd on 18379)::

    python infra/k8s/controlplane.py build    # build (if needed) and print the binaries
    python infra/k8s/controlplane.py up       # build if needed, start, wait until ready
    python infra/k8s/controlplane.py env      # KUBECONFIG=… and the admin token, for a shell
    python infra/k8s/controlplane.py down     # stop; --wipe forgets etcd's data as well
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
HOME = Path(os.environ.get("FLOTILLA_K8S_HOME", REPO_ROOT / ".stack" / "k8s"))

KUBERNETES_VERSION = "v1.34.4"
STAGING_VERSION = "v0.34.4"  # the published copies of k8s.io/kubernetes' ./staging modules
ETCD_VERSION = "v3.6.4"  # the version kubernetes v1.34.4's go.mod requires
BINARIES = ("kube-apiserver", "kube-controller-manager", "kubectl", "etcd")

HOST = "127.0.0.1"
API_PORT = int(os.environ.get("FLOTILLA_K8S_PORT", "18443"))
ETCD_PORT = int(os.environ.get("FLOTILLA_K8S_ETCD_PORT", "18379"))
ETCD_PEER_PORT = ETCD_PORT + 1
SERVICE_CIDR = "10.96.0.0/16"
ISSUER = "https://kubernetes.default.svc.cluster.local"

ETCD_MAIN = """\
// etcd, as the control plane's store: the same entry point as the etcd binary.
package main

import (
\t"os"

\t"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
"""


class ControlPlaneError(RuntimeError):
    """The control plane could not be built or started; the message says where to look."""


@dataclass(frozen=True)
class Paths:
    home: Path = HOME

    @property
    def bin(self) -> Path:
        return self.home / "bin" / KUBERNETES_VERSION

    @property
    def src(self) -> Path:
        return self.home / "src"

    @property
    def pki(self) -> Path:
        return self.home / "pki"

    @property
    def run(self) -> Path:
        return self.home / "run"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.home / "etcd"

    @property
    def kubeconfig(self) -> Path:
        return self.home / "kubeconfig"

    @property
    def admin_token(self) -> Path:
        return self.pki / "admin-token"

    @property
    def ca(self) -> Path:
        return self.pki / "ca.crt"

    def binary(self, name: str) -> Path:
        return self.bin / name


PATHS = Paths()


# ---------------------------------------------------------------------------- build


def go_mod(kubernetes_gomod: str) -> str:
    """Our scratch module: kubernetes itself, and each module its go.mod replaces with a
    ./staging folder pinned to the published version of the same release (a module
    dependency cannot use the replace lines of the module it requires)."""
    staging = []
    for line in kubernetes_gomod.splitlines():
        parts = line.split("=>")
        if len(parts) == 2 and parts[1].strip().startswith("./staging/"):
            staging.append(parts[0].strip())
    if not staging:
        raise ControlPlaneError("k8s.io/kubernetes' go.mod replaces no ./staging module: unexpected layout")
    replaces = "\n".join(f"\t{module} => {module} {STAGING_VERSION}" for module in sorted(staging))
    return (
        "module flotilla.local/controlplane\n\ngo 1.24.0\n\n"
        f"require (\n\tk8s.io/kubernetes {KUBERNETES_VERSION}\n\tgo.etcd.io/etcd/server/v3 {ETCD_VERSION}\n)\n\n"
        f"replace (\n{replaces}\n)\n"
    )


def _go_env() -> dict[str, str]:
    """The caller's Go settings, plus: resolve our scratch module's requirements as needed
    (it has no go.sum of its own) and stamp no VCS data (it lives inside this repository)."""
    flags = os.environ.get("GOFLAGS", "").split()
    return {**os.environ, "GOFLAGS": " ".join([*flags, "-mod=mod", "-buildvcs=false"])}


def _go(args: list[str], cwd: Path, log: Path) -> None:
    env = {**_go_env(), "CGO_ENABLED": "0"}
    with log.open("a") as out:
        out.write(f"$ go {' '.join(args)}\n")
        out.flush()
        done = subprocess.run(["go", *args], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-5:])
        raise ControlPlaneError(f"go {args[0]} failed (exit {done.returncode}); read {log}: {tail}")


def built(paths: Paths = PATHS) -> bool:
    return all(os.access(paths.binary(name), os.X_OK) for name in BINARIES)


def build(paths: Paths = PATHS) -> float:
    """Build the binaries unless this version's are already there; seconds it took."""
    if built(paths):
        return 0.0
    if shutil.which("go") is None:
        raise ControlPlaneError("the Go toolchain is not on PATH: the control plane is built from the Go module proxy")
    began = time.monotonic()
    paths.src.mkdir(parents=True, exist_ok=True)
    paths.logs.mkdir(parents=True, exist_ok=True)
    log = paths.logs / "build.log"
    log.write_text("")
    (paths.src / "etcd").mkdir(exist_ok=True)
    (paths.src / "etcd" / "main.go").write_text(ETCD_MAIN)
    # The kubernetes go.mod, from the module proxy (go's own download, cached).
    (paths.src / "go.mod").write_text(
        f"module flotilla.local/probe\n\ngo 1.24.0\n\nrequire k8s.io/kubernetes {KUBERNETES_VERSION}\n"
    )
    env = _go_env()
    info = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{KUBERNETES_VERSION}"],
        cwd=paths.src,
        env=env,
        capture_output=True,
        text=True,
    )
    if info.returncode != 0:
        raise ControlPlaneError(f"go mod download k8s.io/kubernetes@{KUBERNETES_VERSION} failed: {info.stderr[-500:]}")
    kubernetes_gomod = Path(json.loads(info.stdout)["GoMod"]).read_text()
    (paths.src / "go.mod").write_text(go_mod(kubernetes_gomod))
    (paths.src / "go.sum").unlink(missing_ok=True)
    staging = paths.bin.with_name(paths.bin.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    commands = [f"k8s.io/kubernetes/cmd/{name}" for name in BINARIES if name != "etcd"]
    _go(["build", "-trimpath", "-ldflags=-s -w", "-o", str(staging), *commands, "./etcd"], paths.src, log)
    shutil.rmtree(paths.bin, ignore_errors=True)
    staging.rename(paths.bin)
    return time.monotonic() - began


# ---------------------------------------------------------------------------- PKI


def _write_pki(paths: Paths) -> None:
    """A CA, the API server's serving certificate (127.0.0.1, localhost, the in-cluster
    names), the service-account signing key, and a random admin token. Made once."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID

    if (paths.pki / "apiserver.crt").exists() and paths.admin_token.exists():
        return
    paths.pki.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)

    def pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flotilla-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    names = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
        x509.IPAddress(ipaddress.ip_address(HOST)),
        x509.IPAddress(ipaddress.ip_address("10.96.0.1")),
    ]
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (paths.pki / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (paths.pki / "ca.key").write_bytes(pem_key(ca_key))
    (paths.pki / "apiserver.crt").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (paths.pki / "apiserver.key").write_bytes(pem_key(server_key))
    (paths.pki / "sa.key").write_bytes(pem_key(sa_key))
    (paths.pki / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    token = os.urandom(24).hex()
    # The static token file: token,user,uid,"groups". system:masters is cluster-admin.
    (paths.pki / "tokens.csv").write_text(f'{token},flotilla-admin,flotilla-admin,"system:masters"\n')
    paths.admin_token.write_text(token)
    for secret in ("ca.key", "apiserver.key", "sa.key", "tokens.csv", "admin-token"):
        (paths.pki / secret).chmod(0o600)


def _write_kubeconfig(paths: Paths) -> None:
    import yaml

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "flotilla-test", "cluster": {"server": api_url(), "certificate-authority": str(paths.ca)}}
        ],
        "users": [{"name": "flotilla-admin", "user": {"token": paths.admin_token.read_text().strip()}}],
        "contexts": [{"name": "flotilla-test", "context": {"cluster": "flotilla-test", "user": "flotilla-admin"}}],
        "current-context": "flotilla-test",
    }
    paths.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
    paths.kubeconfig.chmod(0o600)


# ---------------------------------------------------------------------------- processes


def api_url() -> str:
    return f"https://{HOST}:{API_PORT}"


def _pidfile(paths: Paths, name: str) -> Path:
    return paths.run / f"{name}.pid"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_of(name: str, paths: Paths = PATHS) -> int | None:
    try:
        pid = int(_pidfile(paths, name).read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _start(name: str, argv: list[str], paths: Paths) -> int:
    if (pid := pid_of(name, paths)) is not None:
        return pid
    paths.run.mkdir(parents=True, exist_ok=True)
    paths.logs.mkdir(parents=True, exist_ok=True)
    log = (paths.logs / f"{name}.log").open("ab")
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    _pidfile(paths, name).write_text(str(proc.pid))
    return proc.pid


def _commands(paths: Paths) -> dict[str, list[str]]:
    pki = paths.pki
    etcd_url = f"http://{HOST}:{ETCD_PORT}"
    return {
        "etcd": [
            str(paths.binary("etcd")),
            "--name=flotilla-test",
            f"--data-dir={paths.etcd_data}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://{HOST}:{ETCD_PEER_PORT}",
            f"--initial-advertise-peer-urls=http://{HOST}:{ETCD_PEER_PORT}",
            f"--initial-cluster=flotilla-test=http://{HOST}:{ETCD_PEER_PORT}",
            "--quota-backend-bytes=1073741824",
            "--log-level=warn",
        ],
        "kube-apiserver": [
            str(paths.binary("kube-apiserver")),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={HOST}",
            f"--advertise-address={HOST}",
            f"--secure-port={API_PORT}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-account-issuer={ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--disable-admission-plugins=ServiceAccount",
            "--v=1",
        ],
        "kube-controller-manager": [
            str(paths.binary("kube-controller-manager")),
            f"--kubeconfig={paths.kubeconfig}",
            f"--authentication-kubeconfig={paths.kubeconfig}",
            f"--authorization-kubeconfig={paths.kubeconfig}",
            f"--bind-address={HOST}",
            "--secure-port=0",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=false",
            "--leader-elect=false",
            # What a Deployment needs to have ReplicaSets and a rollout history; the
            # namespace, garbage and service-account controllers keep the API tidy.
            "--controllers=deployment,replicaset,namespace,garbagecollector,serviceaccount,serviceaccount-token",
            "--v=1",
        ],
    }


def _ready(paths: Paths) -> bool:
    context = ssl.create_default_context(cafile=str(paths.ca))
    request = urllib.request.Request(
        f"{api_url()}/readyz", headers={"Authorization": f"Bearer {paths.admin_token.read_text().strip()}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=3, context=context) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def up(paths: Paths = PATHS, timeout: float = 90) -> float:
    """Build if needed, start etcd, the API server and the controller manager; seconds
    until the API server was ready."""
    build(paths)
    _write_pki(paths)
    _write_kubeconfig(paths)
    commands = _commands(paths)
    began = time.monotonic()
    _start("etcd", commands["etcd"], paths)
    _start("kube-apiserver", commands["kube-apiserver"], paths)
    deadline = began + timeout
    while not _ready(paths):
        for name in ("etcd", "kube-apiserver"):
            if pid_of(name, paths) is None:
                log = paths.logs / f"{name}.log"
                tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-5:])
                raise ControlPlaneError(f"{name} exited while starting; read {log}: {tail}")
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"kube-apiserver not ready on {api_url()} within {timeout:.0f}s")
        time.sleep(0.5)
    _start("kube-controller-manager", commands["kube-controller-manager"], paths)
    return time.monotonic() - began


def down_one(name: str, paths: Paths = PATHS, *, timeout: float = 20) -> None:
    """Stop one of the processes (SIGTERM, then SIGKILL after ``timeout``)."""
    pid = pid_of(name, paths)
    if pid is not None:
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
    _pidfile(paths, name).unlink(missing_ok=True)


def down(paths: Paths = PATHS, *, wipe: bool = False, timeout: float = 20) -> None:
    """Stop the processes this tool started (by their pid files), newest first."""
    for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
        down_one(name, paths, timeout=timeout)
    if wipe:
        shutil.rmtree(paths.etcd_data, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="controlplane", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("build", help="build the binaries (if needed) and print where they are")
    sub.add_parser("up", help="start etcd, kube-apiserver and kube-controller-manager")
    sub.add_parser("env", help="print KUBECONFIG for a shell")
    stop = sub.add_parser("down", help="stop them")
    stop.add_argument("--wipe", action="store_true", help="forget etcd's data too")
    args = parser.parse_args(argv)
    try:
        if args.action == "build":
            seconds = build()
            how = f"built in {seconds:.0f}s" if seconds else "cached"
            print(f"[k8s] {KUBERNETES_VERSION} binaries in {PATHS.bin} ({how})")
        elif args.action == "up":
            seconds = up()
            print(f"[k8s] API server ready on {api_url()} after {seconds:.1f}s; KUBECONFIG={PATHS.kubeconfig}")
        elif args.action == "env":
            print(f"export KUBECONFIG={PATHS.kubeconfig}")
        else:
            down(wipe=args.wipe)
            print("[k8s] control plane stopped")
    except ControlPlaneError as exc:
        print(f"[k8s] ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
