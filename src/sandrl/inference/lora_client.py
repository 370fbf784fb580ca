"""What the SGLang and vLLM clients share for LoRA: one adapter per version, and the version of each token.

A policy trained with LoRA pushes a new adapter each update instead of new weights
(:meth:`~sandrl.inference.base.LoraClient.update_lora_adapter`). The client loads it under the name
``sandrl-v<version>`` and samples with it from then on; it keeps the adapter before it loaded, so the
requests still running with that one finish on it, and unloads the older ones. A request names its
adapter when it is sent and keeps it to its end (neither server swaps a request's adapter), so every
token of its answer is that adapter's version: exact, where the servers' own labels would only say
the base's.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

from sandrl.errors import ConfigError
from sandrl.inference.base import LORA_NAME_PREFIX, Generation, LoraClient

ADAPTER_CONFIG = "adapter_config.json"
"""The file that makes a directory a LoRA adapter (``peft``'s)."""


def is_adapter_dir(path: str | Path) -> bool:
    """Whether ``path`` holds an adapter (``adapter_config.json``) rather than a full checkpoint (``config.json``)."""
    directory = Path(path).expanduser()
    return (directory / ADAPTER_CONFIG).is_file() and not (directory / "config.json").exists()


class AdapterVersions:
    """The adapters a client loaded through :meth:`swap`, by name, with their versions."""

    def __init__(self) -> None:
        self._versions: dict[str, int] = {}

    def version_of(self, name: str | None) -> int | None:
        """The version of the adapter ``name``, if this client loaded it by version."""
        return self._versions.get(name) if name is not None else None

    def next_version(self, current: int) -> int:
        """The version after the newest adapter loaded, or after ``current`` (the server's) before any."""
        return max(self._versions.values(), default=current) + 1

    async def swap(self, client: LoraClient, path: str, version: int, active: str | None) -> str:
        """Load ``path`` as ``sandrl-v<version>`` and unload what is older than ``active``; return the new name."""
        name = f"{LORA_NAME_PREFIX}{version}"
        if name not in self._versions:
            # A name this client never loaded may be left on the server by an earlier run (a resumed trainer).
            with contextlib.suppress(ConfigError):
                await client.unload_lora_adapter(name)
        await client.load_lora_adapter(name, path)
        self._versions[name] = version
        for old in [n for n in self._versions if n not in (name, active)]:
            await client.unload_lora_adapter(old)
            del self._versions[old]
        return name


def labelled(generation: Generation, version: int | None) -> Generation:
    """``generation`` with every token of version ``version`` (its adapter's), when that is known."""
    if version is None:
        return generation
    tokens = [version] * len(generation.output_ids)
    return replace(generation, weight_version=version, start_weight_version=version, output_weight_versions=tokens)
