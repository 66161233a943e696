"""The image tars the cluster loads, written without a Docker engine: the layout
``ctr images import`` reads (a ``docker save`` tar), and the same bytes for the same
inputs, so a second build knows nothing changed. No cluster needed."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from tests.cluster.conftest import clusterctl

images = clusterctl.clusterimages


def _image(content: bytes = b"\x7fELF binary") -> object:
    return images.Image(
        tag="flotilla.local/test:1",
        files={"/bin/tool": images.ImageFile(content, 0o755)},
        entrypoint=["/bin/tool"],
        cmd=["serve"],
        user="65532",
    )


def test_the_tar_is_a_docker_save_layout_whose_digests_hold(tmp_path: Path) -> None:
    image = _image()
    image_id = images.write(image, tmp_path / "test.tar")
    with tarfile.open(tmp_path / "test.tar") as archive:
        manifest = json.load(archive.extractfile("manifest.json"))
        [entry] = manifest
        assert entry["RepoTags"] == ["flotilla.local/test:1"]
        config_bytes = archive.extractfile(entry["Config"]).read()
        layer_bytes = archive.extractfile(entry["Layers"][0]).read()
    assert image_id == "sha256:" + hashlib.sha256(config_bytes).hexdigest() == images.image_id(image)
    config = json.loads(config_bytes)
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer_bytes).hexdigest()]
    assert config["config"]["Entrypoint"] == ["/bin/tool"] and config["config"]["User"] == "65532"
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    with tarfile.open(fileobj=io.BytesIO(layer_bytes)) as layer:
        members = {m.name: m for m in layer.getmembers()}
    assert members["bin/tool"].mode == 0o755 and members["bin"].isdir()
    assert all(m.mtime == 0 and m.uid == 0 for m in members.values())


def test_same_inputs_same_bytes_and_a_change_changes_the_id(tmp_path: Path) -> None:
    first = images.write(_image(), tmp_path / "a.tar")
    second = images.write(_image(), tmp_path / "b.tar")
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    assert first == second
    assert images.write(_image(b"another build"), tmp_path / "c.tar") != first
