"""The LoRA adapters an engine holds by name (SGLang's ``/load_lora_adapter``), under a cap.

The cap (``EngineConfig.max_loras``) bounds the memory adapters take: it counts the adapters loaded by
name and those unloaded while running requests still use them (a request keeps its adapter to its end,
as SGLang's unload waits for them). The engine calls every method under its own lock.
"""

from __future__ import annotations

from collections.abc import Iterable

from sandrl.errors import ConfigError
from sandrl.inference.lora_adapter import LoraAdapter


class AdapterRegistry:
    """Adapters by name; ``in_use`` arguments are the adapters of the requests in flight."""

    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras
        self._by_name: dict[str, LoraAdapter] = {}

    def paths(self) -> dict[str, str]:
        """Name -> the path each adapter was loaded from, by name."""
        return {name: self._by_name[name].path for name in sorted(self._by_name)}

    def check_room(self, name: str, in_use: Iterable[LoraAdapter | None]) -> None:
        """Refuse a load of ``name`` that would take a name in use or go past the cap."""
        if name in self._by_name:
            raise ConfigError(
                f"a LoRA adapter named {name!r} is already loaded: unload it first (/unload_lora_adapter), "
                "or load this one under another name"
            )
        held = {id(a) for a in self._by_name.values()} | {id(a) for a in in_use if a is not None}
        if len(held) >= self.max_loras:
            raise ConfigError(
                f"{len(held)} LoRA adapters are loaded or still used by running requests, the most this engine "
                f"holds (max_loras = {self.max_loras}): unload one (/unload_lora_adapter) first"
            )

    def add(self, adapter: LoraAdapter, in_use: Iterable[LoraAdapter | None]) -> None:
        self.check_room(adapter.name, in_use)
        self._by_name[adapter.name] = adapter

    def remove(self, name: str) -> None:
        if self._by_name.pop(name, None) is None:
            raise ConfigError(f"no LoRA adapter named {name[:80]!r} is loaded (loaded: {self._listed()})")

    def get(self, name: str) -> LoraAdapter:
        adapter = self._by_name.get(name)
        if adapter is None:
            raise ConfigError(
                f"no LoRA adapter named {name[:80]!r} is loaded (loaded: {self._listed()}): load it first "
                "(/load_lora_adapter with lora_name and lora_path)"
            )
        return adapter

    def _listed(self) -> str:
        return ", ".join(sorted(self._by_name)) or "none"
