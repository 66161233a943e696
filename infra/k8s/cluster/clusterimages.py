"""Container images for the test cluster, written without a Docker engine or a registry.

An image here is one layer of static binaries and small files, in the format that
``docker save`` writes (``manifest.json``, one config blob, one ``layer.tar``), which
``ctr images import`` loads into containerd's content store as it is. Every timestamp is
zero and every owner root, so the same inputs give the same bytes, the same image ID, and
a second ``cluster-up`` can see that nothing changed.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ImageFile:
    """One file of the image: its content and its mode."""

    content: bytes
    mode: int = 0o644


@dataclass(frozen=True)
class Image:
    """What goes into one image: a tag with a registry-like domain (kept local: the
    kubelet never pulls it), files by absolute path, and the process to run."""

    tag: str
    files: dict[str, ImageFile]
    entrypoint: list[str]
    cmd: list[str] = field(default_factory=list)
    user: str = ""
    env: list[str] = field(default_factory=lambda: ["PATH=/"])


def _add(archive: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    archive.addfile(info, io.BytesIO(data))


def _add_dir(archive: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.mtime = 0
    archive.addfile(info)


def layer_bytes(files: dict[str, ImageFile]) -> bytes:
    """The layer: parent folders first, then the files, in sorted order."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        folders: set[str] = set()
        for path in sorted(files):
            parts = path.strip("/").split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                folder = "/".join(parts[:depth])
                if folder not in folders:
                    folders.add(folder)
                    _add_dir(archive, folder)
            _add(archive, path.strip("/"), files[path].content, files[path].mode)
        # Where the kubelet mounts a pod's /etc/hosts, /etc/resolv.conf and the token:
        # runc creates missing mount points, but an image with them is tidier to read.
        for folder in ("etc", "tmp"):
            if folder not in folders:
                _add_dir(archive, folder)
    return buffer.getvalue()


def image_id(image: Image) -> str:
    """The image ID (the config's digest) the tar will have, without writing it."""
    return "sha256:" + hashlib.sha256(_config(image, layer_bytes(image.files))).hexdigest()


def _config(image: Image, layer: bytes) -> bytes:
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Entrypoint": image.entrypoint,
            "Cmd": image.cmd or None,
            "Env": image.env,
            "User": image.user,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "flotilla clusterimages.py"}],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def write(image: Image, target: Path) -> str:
    """Write the image as a ``docker save`` tar at ``target``; its image ID."""
    layer = layer_bytes(image.files)
    config = _config(image, layer)
    digest = hashlib.sha256(config).hexdigest()
    layer_dir = hashlib.sha256(layer).hexdigest()
    manifest = [{"Config": f"{digest}.json", "RepoTags": [image.tag], "Layers": [f"{layer_dir}/layer.tar"]}]
    partial = target.with_name(target.name + ".partial")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(partial, mode="w", format=tarfile.PAX_FORMAT) as archive:
        _add_dir(archive, layer_dir)
        _add(archive, f"{layer_dir}/layer.tar", layer, 0o644)
        _add(archive, f"{digest}.json", config, 0o644)
        _add(archive, "manifest.json", json.dumps(manifest).encode(), 0o644)
    partial.replace(target)
    return f"sha256:{digest}"


def binary_image(tag: str, binary: Path, *, args: list[str] | None = None, user: str = "") -> Image:
    """An image of one static binary at ``/<name>``, run as its entrypoint."""
    name = binary.name
    return Image(
        tag=tag,
        files={f"/{name}": ImageFile(binary.read_bytes(), 0o755)},
        entrypoint=[f"/{name}"],
        cmd=args or [],
        user=user,
    )
