"""A one-node Kubernetes cluster that runs pods, built and run here with no registry.

The control plane is ``infra/k8s/controlplane.py``'s (etcd, kube-apiserver,
kube-controller-manager and kubectl v1.34.4, built from the Go module proxy); this adds
kube-scheduler, kubelet and kube-proxy by the same recipe, CoreDNS from its Go module,
Debian's containerd, runc and CNI plugins (installed when missing), and a pause image
and a test workload image built here (``clusterimages.py``).

Everything runs inside one mount and one network namespace made for the cluster
(``clusternode.py``): the pod and service ranges, the bridge, the rules kube-proxy and
the CNI plugins write, and the node's address exist only there, and go when it goes.
The machine sees one port on 127.0.0.1 (the API server, relayed) and one cgroup folder,
``/flotilla-cluster``, in each cgroup hierarchy, removed at teardown::

    python infra/k8s/cluster/clusterctl.py build   # build (if needed) every part; times
    python infra/k8s/cluster/clusterctl.py up      # build if needed, start, wait for DNS
    python infra/k8s/cluster/clusterctl.py status
    python infra/k8s/cluster/clusterctl.py usage   # the idle node's CPU and memory
    python infra/k8s/cluster/clusterctl.py down    # stop and remove every trace
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent):  # run by path, not as a package: clusterimages, controlplane
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import clusterimages  # noqa: E402
import clusternode  # noqa: E402
import controlplane  # noqa: E402

REPO_ROOT = HERE.parents[2]
HOME = Path(os.environ.get("FLOTILLA_CLUSTER_HOME", REPO_ROOT / ".stack" / "cluster"))

KUBERNETES_VERSION: str = controlplane.KUBERNETES_VERSION
NODE_BINARIES = ("kube-scheduler", "kubelet", "kube-proxy")
COREDNS_VERSION = "v1.15.0"  # needs Go >= 1.26

# The one port on the machine: 127.0.0.1, relayed into the node's namespace.
API_PORT = int(os.environ.get("FLOTILLA_CLUSTER_API_PORT", "18543"))
# Inside the node's namespace only (nothing on the machine has these addresses or ports).
NODE_NAME = "flotilla-node"
NODE_IP = "10.250.0.1"
INNER_API_PORT = 6443
POD_SUBNET = "10.244.0.0/24"
CLUSTER_CIDR = "10.244.0.0/16"
SERVICE_CIDR: str = controlplane.SERVICE_CIDR  # 10.96.0.0/16: the API server certificate names 10.96.0.1
DNS_IP = "10.96.0.10"
BRIDGE = "flotilla0"
CGROUP_ROOT = "flotilla-cluster"

PAUSE_IMAGE = "flotilla.local/pause:1"
PROBE_IMAGE = "flotilla.local/probe:1"
COREDNS_IMAGE = f"flotilla.local/coredns:{COREDNS_VERSION}"
PACKAGES = {  # Debian package: a file it installs
    "containerd": "/usr/bin/containerd",
    "runc": "/usr/sbin/runc",
    "containernetworking-plugins": "/usr/lib/cni/bridge",
    "nftables": "/usr/sbin/nft",
    "iptables": "/usr/sbin/iptables",
}
CNI_BIN = "/usr/lib/cni"
SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")

# Stopped in this order; the node (the namespaces' holder) last.
NODE_DAEMONS = ("kube-proxy", "kubelet")
CONTROL_PLANE = ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")


class ClusterError(RuntimeError):
    """The cluster could not be built, started or stopped; the message says where to look."""


@dataclass(frozen=True)
class Paths:
    home: Path = HOME

    @property
    def bin(self) -> Path:
        return self.home / "bin" / KUBERNETES_VERSION

    @property
    def coredns(self) -> Path:
        return self.home / "bin" / f"coredns-{COREDNS_VERSION}" / "coredns"

    @property
    def tools(self) -> Path:
        return self.home / "bin" / f"tools-{_tools_digest()}"

    @property
    def images(self) -> Path:
        return self.home / "images"

    @property
    def src(self) -> Path:
        return self.home / "src"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def run(self) -> Path:
        return self.home / "run"

    @property
    def state(self) -> Path:
        """Everything a run writes and teardown deletes: etcd, containerd, the kubelet."""
        return self.home / "state"

    @property
    def node(self) -> Path:
        """The node's private views (clusternode.py): /var/lib, /var/log, kernel settings."""
        return self.home / "node"

    @property
    def controlplane(self) -> Any:
        """controlplane.py's layout for this cluster's PKI (its binaries are the shared ones)."""
        return controlplane.Paths(home=self.home / "controlplane")

    @property
    def kubeconfig(self) -> Path:
        return self.home / "kubeconfig"

    @property
    def node_kubeconfig(self) -> Path:
        return self.home / "node-kubeconfig"

    @property
    def containerd_socket(self) -> Path:
        return self.run / "containerd.sock"

    def binary(self, name: str) -> Path:
        if name in NODE_BINARIES:
            return self.bin / name
        if name == "coredns":
            return self.coredns
        if name in ("pause", "probe"):
            return self.tools / name
        return Path(str(controlplane.PATHS.binary(name)))


PATHS = Paths()


# ---------------------------------------------------------------------------- packages


def ensure_packages() -> list[str]:
    """Install Debian's containerd, runc, CNI plugins, nft and iptables when missing (as
    root); the packages it installed."""
    missing = [name for name, path in PACKAGES.items() if not Path(path).exists()]
    if not missing:
        return []
    if os.geteuid() != 0:
        raise ClusterError(f"missing {', '.join(missing)}: run `sudo apt-get install -y {' '.join(missing)}`")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} failed: {done.stderr[-500:]}")
    return missing


# ---------------------------------------------------------------------------- build


def _tools_digest() -> str:
    digest = hashlib.sha256()
    for source in sorted((HERE / "go").rglob("*.go")):
        digest.update(source.relative_to(HERE).as_posix().encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:12]


def _go(args: list[str], cwd: Path, log: Path) -> None:
    """``go`` at low priority (two cores shared with the rest of the machine), static."""
    env = {**controlplane._go_env(), "CGO_ENABLED": "0"}
    with log.open("a") as out:
        out.write(f"$ go {' '.join(args)}\n")
        out.flush()
        done = subprocess.run(["nice", "-n", "10", "go", *args], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-5:])
        raise ClusterError(f"go {args[0]} failed (exit {done.returncode}); read {log}: {tail}")


def _build_into(target: Path, build: Callable[[Path], None]) -> None:
    """Build into ``<target>.partial`` and rename, so a half-built folder is never used."""
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    build(partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def build_node_binaries(paths: Paths, log: Path) -> None:
    """kube-scheduler, kubelet, kube-proxy: controlplane.py's scratch module, built here."""
    src = paths.src / "kubernetes"
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text(
        f"module flotilla.local/probe\n\ngo 1.24.0\n\nrequire k8s.io/kubernetes {KUBERNETES_VERSION}\n"
    )
    info = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{KUBERNETES_VERSION}"],
        cwd=src,
        env=controlplane._go_env(),
        capture_output=True,
        text=True,
    )
    if info.returncode != 0:
        raise ClusterError(f"go mod download k8s.io/kubernetes@{KUBERNETES_VERSION} failed: {info.stderr[-500:]}")
    (src / "go.mod").write_text(controlplane.go_mod(Path(json.loads(info.stdout)["GoMod"]).read_text()))
    (src / "go.sum").unlink(missing_ok=True)
    (src / "etcd").mkdir(exist_ok=True)  # go_mod() requires etcd for controlplane.py's ./etcd
    (src / "etcd" / "main.go").write_text(controlplane.ETCD_MAIN)
    commands = [f"k8s.io/kubernetes/cmd/{name}" for name in NODE_BINARIES]
    _build_into(
        paths.bin,
        lambda out: _go(["build", "-trimpath", f"-ldflags={version_ldflags()}", "-o", str(out), *commands], src, log),
    )


def version_ldflags() -> str:
    """Stamp the release, as Kubernetes' own build does: a module build otherwise reports
    v0.0.0-master, and the node's kubeletVersion would say so."""
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    stamps = []
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        stamps += [
            f"-X {package}.gitVersion={KUBERNETES_VERSION}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return " ".join(["-s", "-w", *stamps])


def build_coredns(paths: Paths, log: Path) -> None:
    src = paths.src / "coredns"
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text(
        f"module flotilla.local/coredns\n\ngo 1.26\n\nrequire github.com/coredns/coredns {COREDNS_VERSION}\n"
    )
    (src / "go.sum").unlink(missing_ok=True)
    _build_into(
        paths.coredns.parent,
        lambda out: _go(
            ["build", "-trimpath", "-ldflags=-s -w", "-o", str(out / "coredns"), "github.com/coredns/coredns"], src, log
        ),
    )


def build_tools(paths: Paths, log: Path) -> None:
    """pause and probe (go/): no dependencies beyond Go's standard library."""
    src = paths.src / "tools"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(HERE / "go", src)
    (src / "go.mod").write_text("module flotilla.local/clustertools\n\ngo 1.24.0\n")
    _build_into(
        paths.tools, lambda out: _go(["build", "-trimpath", "-ldflags=-s -w", "-o", str(out), "./..."], src, log)
    )


IMAGES = ("pause", "probe", "coredns")


def image(paths: Paths, name: str) -> clusterimages.Image:
    """The image of one of the binaries built here, run as a non-root user."""
    tag, args, user = {
        "pause": (PAUSE_IMAGE, [], "65535"),
        "probe": (PROBE_IMAGE, ["serve"], "65532"),
        "coredns": (COREDNS_IMAGE, [], "65532"),
    }[name]
    return clusterimages.binary_image(tag, paths.binary(name), args=args, user=user)


def build(paths: Paths = PATHS) -> dict[str, float]:
    """Build every missing part; seconds each took (0 for a cached one)."""
    if shutil.which("go") is None:
        raise ClusterError("the Go toolchain is not on PATH: the cluster is built from the Go module proxy")
    paths.logs.mkdir(parents=True, exist_ok=True)
    log = paths.logs / "build.log"
    took: dict[str, float] = {}

    def timed(name: str, ready: bool, step: Callable[[], object]) -> None:
        began = time.monotonic()
        if not ready:
            step()
        took[name] = 0.0 if ready else round(time.monotonic() - began, 1)

    timed("control plane", controlplane.built(), lambda: controlplane.build())
    timed(
        "kube-scheduler, kubelet, kube-proxy",
        all(os.access(paths.binary(n), os.X_OK) for n in NODE_BINARIES),
        lambda: build_node_binaries(paths, log),
    )
    timed("coredns", os.access(paths.coredns, os.X_OK), lambda: build_coredns(paths, log))
    timed("pause, probe", os.access(paths.binary("probe"), os.X_OK), lambda: build_tools(paths, log))
    began = time.monotonic()
    for name in IMAGES:
        wanted = image(paths, name)
        tar = paths.images / f"{name}.tar"
        stamp = paths.images / f"{name}.id"
        if not tar.exists() or not stamp.exists() or stamp.read_text() != clusterimages.image_id(wanted):
            stamp.write_text(clusterimages.write(wanted, tar))
    took["images"] = round(time.monotonic() - began, 1)
    return took


# ---------------------------------------------------------------------------- configuration


def _write_client_cert(pki: Path) -> None:
    """The API server's client certificate for the kubelet's port (logs, exec,
    port-forward): signed by the cluster CA, in system:masters."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    if (pki / "kubelet-client.crt").exists():
        return
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, "flotilla-apiserver-kubelet-client"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    (pki / "kubelet-client.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (pki / "kubelet-client.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (pki / "kubelet-client.key").chmod(0o600)


def _kubeconfig(paths: Paths, server: str) -> str:
    import yaml

    cp = paths.controlplane
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "flotilla-cluster", "cluster": {"server": server, "certificate-authority": str(cp.ca)}}],
        "users": [{"name": "flotilla-admin", "user": {"token": cp.admin_token.read_text().strip()}}],
        "contexts": [
            {"name": "flotilla-cluster", "context": {"cluster": "flotilla-cluster", "user": "flotilla-admin"}}
        ],
        "current-context": "flotilla-cluster",
    }
    return str(yaml.safe_dump(config, sort_keys=False))


def write_config(paths: Paths) -> None:
    """PKI (controlplane.py's, plus the kubelet client certificate), kubeconfigs for the
    machine (the relayed port) and for the node (the API server inside), containerd's,
    the CNI's, the kubelet's and kube-proxy's configuration."""
    import yaml

    cp = paths.controlplane
    controlplane._write_pki(cp)
    _write_client_cert(cp.pki)
    for path, server in (
        (paths.kubeconfig, f"https://127.0.0.1:{API_PORT}"),
        (paths.node_kubeconfig, f"https://127.0.0.1:{INNER_API_PORT}"),
    ):
        path.write_text(_kubeconfig(paths, server))
        path.chmod(0o600)
    state = paths.state
    for folder in ("containerd/root", "containerd/state", "containerd/opt", "cni/net.d", "cni/ipam", "kubelet/root"):
        (state / folder).mkdir(parents=True, exist_ok=True)
    (state / "containerd" / "config.toml").write_text(
        f"""\
# The test cluster's containerd: its own socket, root and state; the CRI with runc in
# cgroupfs mode (no systemd here) and the sandbox image built here.
version = 2
root = "{state / "containerd" / "root"}"
state = "{state / "containerd" / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{paths.containerd_socket}"

[ttrpc]
  address = "{paths.containerd_socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{state / "containerd" / "opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # Root here lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below its own.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{state / "cni" / "net.d"}"
    max_conf_num = 1
"""
    )
    cni = {
        "cniVersion": "0.4.0",
        "name": "flotilla",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,  # no way out of the node's namespace: nothing to masquerade for
                "hairpinMode": True,  # a pod reaching itself through its own Service
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(state / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    (state / "cni" / "net.d" / "10-flotilla.conflist").write_text(json.dumps(cni, indent=2))
    (paths.node / "resolv.conf").parent.mkdir(parents=True, exist_ok=True)
    # dnsPolicy: Default pods (CoreDNS) get this: no upstream, as nothing lies outside.
    (paths.node / "resolv.conf").write_text("# the test cluster has no network beyond its own namespace\n")
    kubelet = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(cp.ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP_ROOT}",
        "failCgroupV1": False,  # this machine mounts cgroup v1 (hybrid)
        "oomScoreAdj": 0,  # no CAP_SYS_RESOURCE: the default -999 cannot be set
        "makeIPTablesUtilChains": False,
        "clusterDNS": [DNS_IP],
        "clusterDomain": "cluster.local",
        "resolvConf": str(paths.node / "resolv.conf"),
        "podLogsDir": str(state / "pod-logs"),
        "volumePluginDir": str(state / "kubelet" / "volume-plugins"),
        "maxPods": 50,
        "failSwapOn": False,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "2%",
            "imagefs.available": "2%",
            "nodefs.inodesFree": "2%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "registerNode": True,
        "nodeStatusUpdateFrequency": "5s",
    }
    (state / "kubelet" / "config.yaml").write_text(yaml.safe_dump(kubelet, sort_keys=False))
    proxy = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(paths.node_kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": CLUSTER_CIDR,
        "bindAddress": NODE_IP,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # 0: leave the conntrack table size and timeouts as they are (the size is global).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }
    (state / "kube-proxy.yaml").write_text(yaml.safe_dump(proxy, sort_keys=False))


def _commands(paths: Paths) -> dict[str, list[str]]:
    pki = paths.controlplane.pki
    state = paths.state
    etcd = "http://127.0.0.1:2379"
    return {
        "etcd": [
            str(paths.binary("etcd")),
            "--name=flotilla-cluster",
            f"--data-dir={state / 'etcd'}",
            f"--listen-client-urls={etcd}",
            f"--advertise-client-urls={etcd}",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=flotilla-cluster=http://127.0.0.1:2380",
            "--quota-backend-bytes=1073741824",
            "--log-level=warn",
        ],
        "kube-apiserver": [
            str(paths.binary("kube-apiserver")),
            f"--etcd-servers={etcd}",
            "--bind-address=0.0.0.0",  # the namespace's: 127.0.0.1 (the relay, the node) and the node IP (pods)
            f"--advertise-address={NODE_IP}",
            f"--secure-port={INNER_API_PORT}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP",  # the node's name resolves nowhere
            "--authorization-mode=RBAC",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-account-issuer={controlplane.ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--v=1",
        ],
        "kube-controller-manager": [
            str(paths.binary("kube-controller-manager")),
            f"--kubeconfig={paths.node_kubeconfig}",
            f"--authentication-kubeconfig={paths.node_kubeconfig}",
            f"--authorization-kubeconfig={paths.node_kubeconfig}",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--leader-elect=false",
            "--v=1",
        ],
        "kube-scheduler": [
            str(paths.binary("kube-scheduler")),
            f"--kubeconfig={paths.node_kubeconfig}",
            f"--authentication-kubeconfig={paths.node_kubeconfig}",
            f"--authorization-kubeconfig={paths.node_kubeconfig}",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            "--leader-elect=false",
            "--v=1",
        ],
        "containerd": ["/usr/bin/containerd", f"--config={state / 'containerd' / 'config.toml'}", "--log-level=warn"],
        "kubelet": [
            str(paths.binary("kubelet")),
            f"--config={state / 'kubelet' / 'config.yaml'}",
            f"--kubeconfig={paths.node_kubeconfig}",
            f"--root-dir={state / 'kubelet' / 'root'}",
            f"--cert-dir={state / 'kubelet' / 'pki'}",
            f"--node-ip={NODE_IP}",
            f"--hostname-override={NODE_NAME}",
            "--v=1",
        ],
        "kube-proxy": [str(paths.binary("kube-proxy")), f"--config={state / 'kube-proxy.yaml'}", "--v=1"],
    }


# ---------------------------------------------------------------------------- processes


def _pidfile(paths: Paths, name: str) -> Path:
    return paths.run / f"{name}.pid"


# The processes this process started, so that their exit is collected (no zombies).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def pid_of(name: str, paths: Paths = PATHS) -> int | None:
    try:
        pid = int(_pidfile(paths, name).read_text())
    except (OSError, ValueError):
        return None
    if pid in _CHILDREN and _CHILDREN[pid].poll() is not None:
        del _CHILDREN[pid]
        return None
    return pid if controlplane._alive(pid) and not _zombie(pid) else None


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _start(name: str, argv: list[str], paths: Paths, *, in_node: bool = True, **popen: Any) -> int:
    if (pid := pid_of(name, paths)) is not None:
        return pid
    if in_node:
        holder = pid_of("node", paths)
        if holder is None:
            raise ClusterError(f"cannot start {name}: the node's namespaces are not up")
        argv = ["nsenter", f"--target={holder}", "--mount", "--net", "--", *argv]
    paths.run.mkdir(parents=True, exist_ok=True)
    paths.logs.mkdir(parents=True, exist_ok=True)
    # nft, iptables, ip and mount live in sbin: a caller's PATH (make, CI) may lack it.
    path = os.environ.get("PATH", "")
    env = {**os.environ, "PATH": ":".join([path, *(d for d in SBIN if d not in path.split(":"))])}
    with (paths.logs / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            **popen,
        )
    _pidfile(paths, name).write_text(str(proc.pid))
    _CHILDREN[proc.pid] = proc
    return proc.pid


def _log_tail(paths: Paths, name: str, lines: int = 5) -> str:
    log = paths.logs / f"{name}.log"
    try:
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait(what: str, check: Callable[[], bool], timeout: float, paths: Paths, watch: tuple[str, ...]) -> float:
    """Poll ``check`` until true; fail early if a watched process died."""
    began = time.monotonic()
    while not check():
        for name in watch:
            if pid_of(name, paths) is None:
                raise ClusterError(
                    f"{name} exited while waiting for {what}; read {paths.logs / name}.log: {_log_tail(paths, name)}"
                )
        if time.monotonic() - began > timeout:
            raise ClusterError(f"{what} not within {timeout:.0f}s")
        time.sleep(0.5)
    return time.monotonic() - began


def api(path: str, paths: Paths = PATHS, *, method: str = "GET", body: Any = None, timeout: float = 5) -> Any:
    """One call to the API server through the machine's relayed port, as the admin."""
    cp = paths.controlplane
    request = urllib.request.Request(
        f"https://127.0.0.1:{API_PORT}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {cp.admin_token.read_text().strip()}",
            "Content-Type": "application/json",
        },
    )
    context = ssl.create_default_context(cafile=str(cp.ca))
    with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
        body = resp.read()
    return json.loads(body) if resp.headers.get_content_type() == "application/json" else body.decode()


def _answers(path: str, paths: Paths, accept: Callable[[Any], bool] = lambda _: True) -> bool:
    try:
        return accept(api(path, paths))
    except (urllib.error.URLError, OSError, ValueError):
        return False


def kubectl(*args: str, paths: Paths = PATHS, input: str | None = None, timeout: float = 60) -> str:
    done = subprocess.run(
        [str(paths.binary("kubectl")), f"--kubeconfig={paths.kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()[-800:]}")
    return done.stdout


# ---------------------------------------------------------------------------- cgroups


def cgroup_mounts() -> list[tuple[str, Path]]:
    """(fstype, mount point) of every cgroup hierarchy the machine mounts."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ")
        fstype = fields[1].split()[0]
        if fstype in ("cgroup", "cgroup2"):
            found.append((fstype, Path(fields[0].split()[4])))
    return found


def make_cgroup_root() -> None:
    """The kubelet's cgroupRoot, in each v1 hierarchy (the kubelet checks every one);
    cpuset's needs its CPUs and memory nodes before a task may join."""
    for fstype, mount in cgroup_mounts():
        if fstype != "cgroup":
            continue
        folder = mount / CGROUP_ROOT
        folder.mkdir(exist_ok=True)
        for setting in ("cpuset.cpus", "cpuset.mems"):
            if (mount / setting).exists() and not (folder / setting).read_text().strip():
                (folder / setting).write_text((mount / setting).read_text())


def cgroup_folders() -> list[Path]:
    return [mount / CGROUP_ROOT for _, mount in cgroup_mounts() if (mount / CGROUP_ROOT).is_dir()]


def cgroup_pids() -> set[int]:
    """Every process in the cluster's cgroups. The kubelet and containerd remove a pod's
    folders while this walks them (a teardown races them), so a folder gone between its
    listing and its reading is skipped (os.walk ignores it), never an error."""
    pids: set[int] = set()
    for root in cgroup_folders():
        for folder, _, files in os.walk(root):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(p) for p in (Path(folder) / "cgroup.procs").read_text().split())
    return pids


def remove_cgroups(timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    for root in cgroup_folders():
        for folder in [*sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)), root]:
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        raise ClusterError(f"cannot remove cgroup {folder}: {exc}") from exc
                    for pid in cgroup_pids():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    time.sleep(0.2)


# ---------------------------------------------------------------------------- node


def _namespace_of(pid: int, kind: str = "mnt") -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def node_processes(paths: Paths = PATHS) -> set[int]:
    """Every process of the cluster: in the node's mount namespace (its daemons, the
    containerd shims) or in its cgroups (the pods' processes)."""
    pids = cgroup_pids()
    try:
        namespace = (paths.run / "node.mnt").read_text().strip()
    except OSError:
        return pids
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _namespace_of(int(entry.name)) == namespace:
            pids.add(int(entry.name))
    return pids


def start_node(paths: Paths) -> int:
    """The namespaces' holder, with the API server's relay on the machine's 127.0.0.1."""
    if (pid := pid_of("node", paths)) is not None:
        return pid
    ready = paths.run / "node.ready"
    ready.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", API_PORT))
    except OSError as exc:
        raise ClusterError(f"127.0.0.1:{API_PORT} is taken (FLOTILLA_CLUSTER_API_PORT): {exc}") from exc
    listener.listen(64)
    try:
        pid = _start(
            "node",
            [
                "unshare",
                "--mount",
                "--net",
                "--propagation",
                "private",
                "--",
                sys.executable,
                str(HERE / "clusternode.py"),
                f"--home={paths.home}",
                f"--node-ip={NODE_IP}",
                f"--relay={listener.fileno()}:127.0.0.1:{INNER_API_PORT}",
                f"--ready={ready}",
            ],
            paths,
            in_node=False,
            pass_fds=(listener.fileno(),),
        )
    finally:
        listener.close()
    _wait("the node's namespaces", ready.exists, 20, paths, ("node",))
    (paths.run / "node.mnt").write_text(_namespace_of(pid, "mnt") or "")
    return pid


def import_images(paths: Paths, names: tuple[str, ...] = IMAGES) -> None:
    """Load ``<name>.tar`` of ``paths.images`` into the node's containerd (the workload's
    images too: workload/workload.py)."""
    holder = pid_of("node", paths)
    for name in names:
        done = subprocess.run(
            [
                # inside the node's mount namespace: ctr keeps its scratch files under /run
                "nsenter",
                f"--target={holder}",
                "--mount",
                "--",
                "ctr",
                f"--address={paths.containerd_socket}",
                "--namespace=k8s.io",
                "images",
                "import",
                str(paths.images / f"{name}.tar"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise ClusterError(f"ctr images import {name}.tar failed: {done.stderr.strip()[-500:]}")


def coredns_manifests() -> list[dict[str, Any]]:
    labels = {"k8s-app": "kube-dns"}
    corefile = """\
.:1053 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
}
"""
    meta = {"name": "coredns", "namespace": "kube-system"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "flotilla:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "flotilla:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "flotilla:coredns"},
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}],
        },
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"Corefile": corefile}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {**meta, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "dnsPolicy": "Default",
                        "containers": [
                            {
                                "name": "coredns",
                                "image": COREDNS_IMAGE,
                                "imagePullPolicy": "Never",  # built here; there is no registry
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"name": "dns", "containerPort": 1053, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": 1053, "protocol": "TCP"},
                                ],
                                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
                                "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10},
                                "resources": {
                                    "requests": {"cpu": "50m", "memory": "32Mi"},
                                    "limits": {"memory": "128Mi"},
                                },
                                "securityContext": {
                                    "runAsNonRoot": True,
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
            "spec": {
                "clusterIP": DNS_IP,
                "selector": labels,
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": 1053, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": 1053, "protocol": "TCP"},
                ],
            },
        },
    ]


def _node_ready(node: Any) -> bool:
    conditions = (node or {}).get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _available(deployment: Any) -> bool:
    return bool((deployment or {}).get("status", {}).get("availableReplicas"))


def up(paths: Paths = PATHS, *, timeout: float = 180) -> dict[str, float]:
    """Build if needed, start every part, wait until CoreDNS answers; seconds per phase."""
    ensure_packages()
    build(paths)
    write_config(paths)
    commands = _commands(paths)
    took: dict[str, float] = {}
    began = time.monotonic()
    make_cgroup_root()
    start_node(paths)
    took["namespaces"] = time.monotonic() - began
    for name in ("etcd", "kube-apiserver"):
        _start(name, commands[name], paths)
    took["api server"] = _wait(
        "the API server", lambda: _answers("/readyz", paths), timeout, paths, ("node", "etcd", "kube-apiserver")
    )
    for name in ("kube-controller-manager", "kube-scheduler", "containerd"):
        _start(name, commands[name], paths)
    _wait("containerd's socket", paths.containerd_socket.exists, 30, paths, ("containerd",))
    mark = time.monotonic()
    import_images(paths)
    took["images imported"] = time.monotonic() - mark
    _start("kubelet", commands["kubelet"], paths)
    _start("kube-proxy", commands["kube-proxy"], paths)
    took["node ready"] = _wait(
        "the node Ready",
        lambda: _answers(f"/api/v1/nodes/{NODE_NAME}", paths, _node_ready),
        timeout,
        paths,
        ("kubelet", "containerd", "kube-apiserver"),
    )
    import yaml

    kubectl("apply", "-f", "-", paths=paths, input=yaml.safe_dump_all(coredns_manifests()))
    took["dns ready"] = _wait(
        "CoreDNS available",
        lambda: _answers("/apis/apps/v1/namespaces/kube-system/deployments/coredns", paths, _available),
        timeout,
        paths,
        ("kubelet", "kube-proxy", "kube-controller-manager", "kube-scheduler"),
    )
    took["total"] = time.monotonic() - began
    took = {k: round(v, 1) for k, v in took.items()}
    (paths.logs / "up-times.json").write_text(json.dumps(took, indent=2))
    return took


def _stop(name: str, paths: Paths, timeout: float = 20) -> None:
    """SIGTERM to the process group, SIGKILL after ``timeout``."""
    pid = pid_of(name, paths)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_of(name, paths) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    _pidfile(paths, name).unlink(missing_ok=True)


def _kill_all(pids: Callable[[], set[int]], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while found := pids() - {os.getpid()}:
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise ClusterError(f"processes that outlived SIGKILL for {timeout:.0f}s: {sorted(found)}")
        time.sleep(0.2)


def down(paths: Paths = PATHS, *, timeout: float = 20) -> None:
    """Stop everything and remove every trace: the node's daemons, the pods (by their
    cgroups), containerd and its shims (by the node's mount namespace), the control
    plane, the namespaces' holder, the cgroup folders and the run's state. Safe to run
    when nothing is up or after a crash."""
    for name in NODE_DAEMONS:
        _stop(name, paths, timeout)
    _kill_all(cgroup_pids, timeout)
    _stop("containerd", paths, timeout)
    for name in CONTROL_PLANE:
        _stop(name, paths, timeout)
    _stop("node", paths, timeout)
    _kill_all(lambda: node_processes(paths), timeout)
    remove_cgroups(timeout)
    shutil.rmtree(paths.state, ignore_errors=True)
    shutil.rmtree(paths.node, ignore_errors=True)
    for leftover in ("node.mnt", "node.ready", "containerd.sock", "containerd.sock.ttrpc"):
        (paths.run / leftover).unlink(missing_ok=True)


def status(paths: Paths = PATHS) -> dict[str, int | None]:
    return {name: pid_of(name, paths) for name in ("node", *reversed(CONTROL_PLANE), "containerd", *NODE_DAEMONS)}


# ---------------------------------------------------------------------------- measuring


def _ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # utime + stime


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def usage(paths: Paths = PATHS, seconds: float = 30) -> dict[str, float]:
    """CPU (% of one core) and memory (PSS, MiB) of every process of the cluster, over
    ``seconds`` of whatever it is doing (idle, right after up)."""
    pids = node_processes(paths) | {p for p in status(paths).values() if p is not None}
    before = {pid: _ticks(pid) for pid in pids}
    time.sleep(seconds)
    hertz = os.sysconf("SC_CLK_TCK")
    cpu = sum(max(_ticks(pid) - ticks, 0) for pid, ticks in before.items()) / hertz / seconds * 100
    memory = sum(_pss_kib(pid) for pid in pids) / 1024
    return {"processes": len(pids), "cpu_percent_of_a_core": round(cpu, 1), "memory_pss_mib": round(memory)}


# ---------------------------------------------------------------------------- the machine's view


def _read(argv: list[str]) -> list[str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"({argv[0]}: {exc})"]
    return done.stdout.splitlines()


def _normalise_rules(lines: list[str]) -> list[str]:
    """Rule listings without their packet counters, which change on their own."""
    import re

    out = []
    for line in lines:
        line = re.sub(r"\[\d+:\d+\]", "[]", line)
        line = re.sub(r"counter packets \d+ bytes \d+", "counter", line)
        if not line.startswith("#"):
            out.append(line)
    return out


def machine_view(paths: Paths = PATHS) -> dict[str, list[str]]:
    """What the cluster must leave as it found it on the machine (its own network
    namespace, its mounts, its cgroups, its processes, the kernel settings), read from
    outside; the teardown test compares one taken before ``up`` with one after ``down``."""
    mounts = [
        line
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if str(paths.home) in line or "flotilla-node-run" in line or CGROUP_ROOT in line
    ]
    settings = [*clusternode.KERNEL_SETTINGS, "net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables"]
    return {
        "links": sorted(line.split(":")[1].strip().split("@")[0] for line in _read(["ip", "-o", "link", "show"])),
        "addresses": sorted(_read(["ip", "-o", "addr", "show"])),
        "routes": sorted(
            _read(["ip", "route", "show", "table", "all"]) + _read(["ip", "-6", "route", "show", "table", "all"])
        ),
        "nftables": _normalise_rules(_read(["nft", "list", "ruleset"])) if shutil.which("nft") else [],
        "iptables": _normalise_rules(_read(["iptables-save"])) if shutil.which("iptables-save") else [],
        "kernel settings": [
            f"{name}={(Path('/proc/sys') / name).read_text().strip()}"
            for name in settings
            if (Path("/proc/sys") / name).exists()
        ],
        "named network namespaces": sorted(_read(["ip", "netns", "list"])),
        "cluster mounts": mounts,
        "cluster cgroups": [str(p) for p in cgroup_folders()],
        "cluster processes": [
            f"{pid} {Path(f'/proc/{pid}/cmdline').read_text(errors='replace').replace(chr(0), ' ')[:200]}"
            for pid in sorted(node_processes(paths))
            if Path(f"/proc/{pid}").exists()
        ],
        "processes from the cluster's home": [
            f"{entry.name} {cmdline[:200]}"
            for entry in Path("/proc").iterdir()
            if entry.name.isdigit()
            and str(paths.home) in (cmdline := _cmdline(entry))
            and int(entry.name) != os.getpid()
        ],
    }


def _cmdline(entry: Path) -> str:
    try:
        return (entry / "cmdline").read_text(errors="replace").replace("\0", " ")
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clusterctl", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("build", help="build every part (if needed); seconds each took")
    sub.add_parser("up", help="start the cluster and wait until CoreDNS is available")
    sub.add_parser("status", help="each process: its pid, or down")
    measure = sub.add_parser("usage", help="CPU and memory of the cluster's processes")
    measure.add_argument("--seconds", type=float, default=30)
    sub.add_parser("env", help="print KUBECONFIG for a shell")
    sub.add_parser("down", help="stop everything and remove every trace")
    args = parser.parse_args(argv)
    try:
        if args.action == "build":
            print(f"[cluster] built (seconds; 0 = cached): {json.dumps(build())}")
        elif args.action == "up":
            took = up()
            print(f"[cluster] up (seconds): {json.dumps(took)}; KUBECONFIG={PATHS.kubeconfig}")
        elif args.action == "status":
            for name, pid in status().items():
                print(f"  {name:24} {pid if pid is not None else 'down'}")
        elif args.action == "usage":
            print(f"[cluster] over {args.seconds:.0f}s: {json.dumps(usage(seconds=args.seconds))}")
        elif args.action == "env":
            print(f"export KUBECONFIG={PATHS.kubeconfig}")
        else:
            down()
            print("[cluster] stopped; nothing left")
    except ClusterError as exc:
        print(f"[cluster] ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
