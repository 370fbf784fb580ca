"""Serving LoRA adapters unmerged: each row of a batch gets its own adapter, the base weights stay as they are.

For an adapted linear layer, output = ``W x + scaling * B (A x)`` (LoRA, arXiv:2106.09685): the
same arithmetic, in the same order, as ``peft``'s ``LoraLayer`` forward, so the served log-probs are the
trained model's. The adapter term is added by a forward hook on the base model's ``nn.Linear`` for the
rows whose request uses that adapter (S-LoRA's and SGLang's unmerged multi-adapter batching, on CPU
with plain matmuls): rows of the base model are not touched at all, so their outputs are bit for bit
those of a batch without adapters, the KV cache stays shared, and an adapter costs its own ``r * (in +
out)`` numbers per layer, not a copy of the model.

Everything here runs on the engine thread: the hooks are installed there, lazily, for the layers some
adapter adapts, and the per-forward plan is set and cleared around each forward. The plan is the
thread's own, so a forward another thread runs on the same model meanwhile (a reference log-prob) sees
no adapter.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from sandrl.inference.lora_adapter import LoraAdapter

# One adapted layer's work in one forward: (A, B, scaling, rows), rows None meaning every row.
_Term = tuple[torch.Tensor, torch.Tensor, float, torch.Tensor | None]


class AdapterRows:
    """Adds each row's adapter to the outputs of ``model``'s linear layers during :meth:`applied` forwards."""

    def __init__(self, model: Any) -> None:
        self._modules: dict[str, torch.nn.Module] = dict(model.named_modules())
        self._hooked: set[str] = set()
        self._local = threading.local()

    @contextlib.contextmanager
    def applied(self, adapters: Sequence[LoraAdapter | None]) -> Iterator[None]:
        """Within the block, row ``i`` of every forward is computed with ``adapters[i]`` (None: the base)."""
        rows_of: dict[int, tuple[LoraAdapter, list[int]]] = {}
        for row, adapter in enumerate(adapters):
            if adapter is not None:
                rows_of.setdefault(id(adapter), (adapter, []))[1].append(row)
        if not rows_of:
            yield
            return
        plan: dict[str, list[_Term]] = {}
        for adapter, rows in rows_of.values():
            index = None if len(rows) == len(adapters) else torch.tensor(rows, dtype=torch.long)
            for module, (a, b) in adapter.layers.items():
                plan.setdefault(module, []).append((a, b, adapter.scaling, index))
        for module in plan.keys() - self._hooked:
            self._modules[module].register_forward_hook(self._hook(module))
            self._hooked.add(module)
        self._local.plan = plan
        try:
            yield
        finally:
            self._local.plan = None

    def _hook(self, module: str) -> Any:
        def add_adapters(_layer: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor | None:
            plan: dict[str, list[_Term]] | None = getattr(self._local, "plan", None)
            terms = plan.get(module) if plan is not None else None
            if not terms:
                return None
            x = args[0]
            for a, b, scaling, rows in terms:
                if rows is None:
                    output = output + F.linear(F.linear(x, a), b) * scaling
                else:
                    output = output.index_add(0, rows, F.linear(F.linear(x.index_select(0, rows), a), b) * scaling)
            return output

        return add_adapters
