"""The test cluster's node: a mount and a network namespace of its own, held open.

``clusterctl.py up`` starts this under ``unshare --mount --net --propagation private``,
handing it listening sockets it opened on the machine's 127.0.0.1. Here, inside the new
namespaces, it:

* brings ``lo`` up and adds the node's address to it (the kubelet refuses a loopback node
  IP; this address exists only in this network namespace, so no route or interface of the
  machine changes);
* hides the places the node's daemons write to whatever their flags say behind folders of
  the cluster's home: ``/run`` (runc's state, shim sockets, pod network namespaces),
  ``/var/lib`` (the CNI cache) and ``/var/log`` (``/var/log/containers`` is fixed in the
  kubelet);
* gives the kernel settings the kubelet rewrites at start (``vm.overcommit_memory``,
  ``kernel.panic``, ...) a private file each, so the machine's values stay as they are;
* relays each host socket to its target inside the namespace (the API server's port, and
  any NodePort asked for), the only way in from the machine.

The cluster's daemons join these namespaces with ``nsenter``; when they and this process
are gone, the kernel drops both namespaces and everything in them: the bridge, the pod
network namespaces, nftables and iptables rules, and every mount.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

# The global (not per network namespace) settings the kubelet's container manager sets.
KERNEL_SETTINGS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def private_views(home: Path) -> None:
    """Mount the node's private folders and kernel-setting files over the shared ones."""
    node = home / "node"
    _run("mount", "-t", "tmpfs", "-o", "mode=755,size=256m", "flotilla-node-run", "/run")
    for shared, private in (("/var/lib", node / "var-lib"), ("/var/log", node / "var-log")):
        private.mkdir(parents=True, exist_ok=True)
        _run("mount", "--bind", str(private), shared)
    settings = node / "sysctl"
    settings.mkdir(parents=True, exist_ok=True)
    for name in KERNEL_SETTINGS:
        source = Path("/proc/sys") / name
        copy = settings / name.replace("/", ".")
        copy.write_text(source.read_text())
        _run("mount", "--bind", str(copy), str(source))


def network(node_ip: str) -> None:
    _run("ip", "link", "set", "lo", "up")
    _run("ip", "addr", "add", f"{node_ip}/32", "dev", "lo")


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (sink, source):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


def _serve(listener: socket.socket, target: tuple[str, int]) -> None:
    while True:
        client, _ = listener.accept()
        try:
            upstream = socket.create_connection(target, timeout=5)
        except OSError:
            client.close()
            continue
        upstream.settimeout(None)
        threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()


def relay(spec: str) -> None:
    """``FD:HOST:PORT``: accept on the inherited socket ``FD`` (bound in the machine's
    network namespace) and connect to ``HOST:PORT`` in this one."""
    fd, host, port = spec.split(":")
    listener = socket.socket(fileno=int(fd))
    threading.Thread(target=_serve, args=(listener, (host, int(port))), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clusternode", description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--node-ip", required=True)
    parser.add_argument("--relay", action="append", default=[], help="FD:HOST:PORT")
    parser.add_argument("--ready", type=Path, required=True, help="file written once the node is set up")
    args = parser.parse_args(argv)
    private_views(args.home)
    network(args.node_ip)
    for spec in args.relay:
        relay(spec)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    args.ready.write_text("ready\n")
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
