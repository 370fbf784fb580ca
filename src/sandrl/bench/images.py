"""``sandrl bench images``: pulling registry images, against the tools people use for it, in one run.

A real registry (Debian's ``docker-registry``) on loopback holds a multi-layer image made here.
Measured, alternating so both see the same host:

- **pull + unpack**: sandrl's pull into a fresh image store (manifest, config, every layer
  downloaded, checked and unpacked) against ``skopeo copy`` to an OCI layout plus ``umoci raw
  unpack`` of it (target: sandrl ≤ 1.0x);
- **a second image sharing all but one layer**: how many layers that pull downloads (target: 1);
- **FROM a cached image to the first exec**: resolving ``FROM <ref>`` (in the store, no network),
  creating a sandbox of it and running ``true``, against a ``host`` sandbox's create and first
  exec (target: ≤ 2x).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from sandrl.errors import ConfigError
from sandrl.images.credentials import DockerConfig
from sandrl.images.host_rootfs import shell_layer
from sandrl.images.local_registry import LocalRegistry
from sandrl.images.oci_layout import LayerSpec, OCILayout, synthetic_entries
from sandrl.images.pull import PullEvent
from sandrl.images.reference import Mirrors
from sandrl.images.registry import RegistryClient
from sandrl.sandbox.base import ImageSource, SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.images import ImageStore
from sandrl.sandbox.bwrap.pulled import pull_into_store
from sandrl.stats import summary_ms
from sandrl.wiring.runner import local_provider

TARGETS = {"pull_over_skopeo_umoci": 1.0, "second_pull_layers": 1, "cached_from_over_host": 2.0}


def _client() -> RegistryClient:
    return RegistryClient(mirrors=Mirrors(), docker_config=DockerConfig(Path("/nonexistent")))


def _write_images(root: Path, layers: int, files: int, file_size: int) -> OCILayout:
    """``a``: ``layers`` synthetic layers; ``b``: the same but its top layer; ``run``: a runnable one."""
    oci = OCILayout(root)

    def specs(top_seed: int) -> list[LayerSpec]:
        return [
            LayerSpec(synthetic_entries(n, files, file_size, seed=top_seed if n == layers - 1 else 0))
            for n in range(layers)
        ]

    oci.add_image(specs(0), tag="a")
    oci.add_image(specs(1), tag="b")
    oci.add_image([shell_layer(root.parent / "shell-rootfs")], tag="run")
    return oci


async def _pull_fresh(work: Path, ref: str) -> float:
    store_dir = work / "sandrl-store"
    shutil.rmtree(store_dir, ignore_errors=True)
    start = time.perf_counter()
    async with _client() as client:
        await pull_into_store(ImageStore(store_dir), ref, client=client)
    took = time.perf_counter() - start
    shutil.rmtree(store_dir, ignore_errors=True)
    return took


def _skopeo_umoci(work: Path, ref: str) -> float:
    layout, rootfs = work / "skopeo-layout", work / "umoci-rootfs"
    for path in (layout, rootfs):
        shutil.rmtree(path, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--quiet",
            "--insecure-policy",
            "--src-tls-verify=false",
            f"docker://{ref}",
            f"oci:{layout}:bench",
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["umoci", "raw", "unpack", "--image", f"{layout}:bench", str(rootfs)], check=True, capture_output=True
    )
    took = time.perf_counter() - start
    for path in (layout, rootfs):
        shutil.rmtree(path, ignore_errors=True)
    return took


async def _first_exec(provider: BwrapProvider, image: str) -> float:
    start = time.perf_counter()
    if image != "host":
        image = await provider.resolve_image(ImageSource(label="bench", dockerfile_text=f"FROM {image}\n"))
    async with await provider.create(SandboxSpec(image=image, ttl_s=120)) as sandbox:
        result = await sandbox.exec("true")
    if not result.ok:
        raise ConfigError(f"the benchmark's sandbox of {image} could not run true: {result.stderr.strip()}")
    return time.perf_counter() - start


async def run(
    *,
    layers: int = 4,
    files: int = 1500,
    file_size: int = 16 << 10,
    repeat: int = 3,
    n_exec: int = 20,
    console: Console | None = None,
) -> dict[str, Any]:
    for tool in ("docker-registry", "skopeo", "umoci"):
        if shutil.which(tool) is None:
            raise ConfigError(f"`sandrl bench images` needs {tool}: apt-get install {tool}")
    say = console.print if console is not None else (lambda *a, **k: None)
    with tempfile.TemporaryDirectory(prefix="sandrl-bench-images-") as tmp:
        work = Path(tmp)
        with LocalRegistry(work / "registry") as registry:
            say(f"writing a {layers}-layer image ({layers * files} files of {file_size >> 10} KiB) and pushing it")
            layout = _write_images(work / "layout", layers, files, file_size)
            for tag in ("a", "b", "run"):
                registry.push(layout.root, f"bench/{tag}", tag=tag)
            ref_a, ref_b = f"{registry.host}/bench/a:a", f"{registry.host}/bench/b:b"
            ours: list[float] = []
            theirs: list[float] = []
            for i in range(repeat):
                say(f"pull + unpack, round {i + 1}/{repeat}")
                ours.append(await _pull_fresh(work, ref_a))
                theirs.append(await asyncio.to_thread(_skopeo_umoci, work, ref_a))
            store = ImageStore(work / "shared-store")
            events: list[PullEvent] = []
            async with _client() as client:
                await pull_into_store(store, ref_a, client=client)
                await pull_into_store(store, ref_b, client=client, on_event=events.append)
            downloaded = sum(e.kind == "layer-start" for e in events)
            say("FROM a cached image to the first exec, beside a host sandbox")
            provider = local_provider(work / "state")
            try:
                run_ref = f"{registry.host}/bench/run:run"
                await pull_into_store(provider.images, run_ref)
                await _first_exec(provider, run_ref)  # the build's cache entry is made once
                cached, host = [], []
                for _ in range(n_exec):
                    cached.append(await _first_exec(provider, run_ref))
                    host.append(await _first_exec(provider, "host"))
            finally:
                await provider.close_all()
    ratio = statistics.median(ours) / statistics.median(theirs)
    from_ratio = statistics.median(cached) / statistics.median(host)
    return {
        "bench": "images",
        "image": {"layers": layers, "files": layers * files, "file_kib": file_size >> 10},
        "sandrl_pull_s": [round(x, 3) for x in ours],
        "skopeo_umoci_s": [round(x, 3) for x in theirs],
        "pull_over_skopeo_umoci": round(ratio, 3),
        "second_pull_layers": downloaded,
        "cached_from_first_exec": summary_ms(cached),
        "host_first_exec": summary_ms(host),
        "cached_from_over_host": round(from_ratio, 3),
        "targets": TARGETS,
        "met": {
            "pull_over_skopeo_umoci": ratio <= TARGETS["pull_over_skopeo_umoci"],
            "second_pull_layers": downloaded == TARGETS["second_pull_layers"],
            "cached_from_over_host": from_ratio <= TARGETS["cached_from_over_host"],
        },
    }
