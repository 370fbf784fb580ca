"""One ImageConfig: what the OCI layout writer writes is what the registry reader reads back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from sandrl.images.manifest import ImageConfig, Platform, parse_config
from sandrl.images.oci_layout import LayerSpec, OCILayout, regular_file


def test_a_written_config_reads_back_as_the_same_config(tmp_path: Path) -> None:
    config = ImageConfig(
        env={"PATH": "/bin", "A": "b=c"},
        workdir="/w",
        user="1000:1000",
        entrypoint=("/entry.sh",),
        cmd=("serve",),
        exposed_ports=("8080/tcp",),
        healthcheck=("CMD-SHELL", "true"),
        platform=Platform("linux", "arm64", "v8"),
        labels={"org.example": "yes"},
        created="2024-01-02T03:04:05Z",
    )
    layout = OCILayout(tmp_path)
    manifest = layout.add_image([LayerSpec([regular_file("f", "x")])], config)
    body = layout.read_blob(json.loads(layout.read_blob(manifest.digest))["config"]["digest"])
    read = parse_config(body, "t")
    assert len(read.diff_ids) == 1
    assert dataclasses.replace(read, diff_ids=()) == config
    assert manifest.platform == config.platform


def test_the_default_config_has_dockers_path() -> None:
    written = ImageConfig()
    assert written.env == {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    assert written.platform == Platform("linux", "amd64")
