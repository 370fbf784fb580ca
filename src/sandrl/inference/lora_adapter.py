"""A LoRA adapter on disk, read for serving: ``peft``'s adapter directory, checked as untrusted input.

What a served adapter is (the directory ``peft``'s ``save_pretrained`` writes, and SGLang's and vLLM's
``load_lora_adapter`` read):

- ``adapter_config.json``: ``r``, ``lora_alpha``, ``use_rslora`` (scale ``alpha / sqrt(r)`` instead of
  ``alpha / r``), ``target_modules``...;
- ``adapter_model.safetensors``: ``base_model.model.<module>.lora_A.weight`` (``[r, in]``) and
  ``...lora_B.weight`` (``[out, r]``) for each adapted linear layer ``<module>`` of the base;
- sandrl's :data:`BASE_FILE`, when sandrl's trainer wrote it: the signature of the base the adapter was
  trained on (:func:`base_signature`), so a server refuses an adapter meant for another model.

The files come from whoever may call the server's control routes, so they are read as hostile: only
safetensors (a pickled ``adapter_model.bin`` is refused, never unpickled), every file's size bounded
before it is read, every tensor's name and shape checked against the served model before its data
is read, and ``peft`` features that change the arithmetic (DoRA, bias, extra trained modules, per-layer
ranks...) refused by name rather than served wrongly. Nothing here imports ``peft``: a server needs none.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from sandrl.errors import ConfigError
from sandrl.inference.lora_client import ADAPTER_CONFIG as CONFIG_FILE

WEIGHTS_FILE = "adapter_model.safetensors"
BASE_FILE = "sandrl_base.json"
"""sandrl's marker of the base model an adapter was trained on (:func:`base_signature`)."""
MAX_JSON_BYTES = 1 << 20
"""The most bytes ``adapter_config.json`` or the base marker may have."""
MAX_NAME_CHARS = 128

_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")
_FLOAT_DTYPES = frozenset({"F32", "F16", "BF16", "F64"})
# peft settings whose non-empty values change what an adapter computes, and which this reader does not do.
_REFUSED = {
    "use_dora": "DoRA (weight-decomposed LoRA)",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D-style transposed weights)",
    "lora_bias": "a trained bias on lora_B",
    "modules_to_save": "fully trained extra modules (modules_to_save)",
    "rank_pattern": "per-layer ranks (rank_pattern)",
    "alpha_pattern": "per-layer alphas (alpha_pattern)",
    "trainable_token_indices": "trained token embeddings (trainable_token_indices)",
    "target_parameters": "adapters on parameters rather than linear layers (target_parameters)",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "layer_replication": "layer replication",
    "use_qalora": "QA-LoRA",
    "use_bdlora": "BD-LoRA",
    "arrow_config": "Arrow routing",
}
_FINGERPRINT_TENSORS = 16
_FINGERPRINT_VALUES = 8


@dataclass(frozen=True, eq=False)
class LoraAdapter:
    """A checked adapter, ready to add to the served model: per linear layer ``(A, B)``, and its scale."""

    name: str
    path: str
    rank: int
    scaling: float
    """``lora_alpha / r`` (``lora_alpha / sqrt(r)`` with ``use_rslora``): what ``B @ A`` is multiplied by."""
    layers: Mapping[str, tuple[torch.Tensor, torch.Tensor]]
    """Module path in the served model (``model.layers.0.self_attn.q_proj``) -> (A ``[r, in]``, B ``[out, r]``)."""

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.layers.values())


def check_adapter_name(name: str) -> str:
    """``name`` if it can name an adapter (what SGLang's ``lora_path`` and vLLM's ``model`` then carry)."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise ConfigError(
            f"a LoRA adapter's name must be 1-{MAX_NAME_CHARS} printable characters, got {str(name)[:80]!r}"
        )
    return name


def read_adapter(path: str | Path, model: Any, *, name: str, max_rank: int) -> LoraAdapter:
    """Read and check the adapter directory ``path`` against ``model`` (the served transformers model).

    Raises :class:`~sandrl.errors.ConfigError` saying what is wrong and what to do, before any tensor
    data is read when the names, shapes or sizes do not fit.
    """
    directory = Path(path).expanduser()
    where = f"the LoRA adapter in {path}"
    if not directory.is_dir():
        raise ConfigError(
            f"{where}: no such directory on the server; pass the directory export_lora wrote "
            "(adapter_config.json + adapter_model.safetensors), as the server sees it"
        )
    config = _read_json(directory / CONFIG_FILE, where)
    rank, scaling = _lora_math(config, where, max_rank)
    marker = directory / BASE_FILE
    if marker.exists():
        check_base(_read_json(marker, where), base_signature(model.state_dict(), _model_type(model)), where)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        pickled = (directory / "adapter_model.bin").exists()
        raise ConfigError(
            f"{where} has no {WEIGHTS_FILE}"
            + (
                " (its adapter_model.bin is a pickle, which a server must not load: save the adapter with "
                "safe_serialization=True)"
                if pickled
                else ": export it with sandrl's export_lora or peft's save_pretrained"
            )
        )
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    limit = max_rank * sum(m.in_features + m.out_features for m in linears.values()) * 8 + MAX_JSON_BYTES
    size = weights.stat().st_size
    if size > limit:
        raise ConfigError(
            f"{where}: {WEIGHTS_FILE} has {size} bytes, more than any rank-{max_rank} adapter of the served "
            f"model can have ({limit}); it was not made for this model"
        )
    dtype = next(iter(model.parameters())).dtype
    return LoraAdapter(name, str(path), rank, scaling, _read_pairs(weights, linears, rank, dtype, where))


def _read_json(path: Path, where: str) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{where} has no {path.name}: export it with sandrl's export_lora or peft's save_pretrained")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise ConfigError(f"{where}: {path.name} is over {MAX_JSON_BYTES} bytes; that is no adapter's")
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: {path.name} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {path.name} holds no JSON object")
    return data


def _lora_math(config: dict[str, Any], where: str, max_rank: int) -> tuple[int, float]:
    """The rank and the scale of ``B @ A`` that ``config`` says, or a ConfigError for what is not LoRA as served."""
    kind = config.get("peft_type", "LORA")
    if kind != "LORA":
        raise ConfigError(f"{where} is a {kind!r} adapter; only LoRA adapters (peft_type LORA) are served")
    for key, what in _REFUSED.items():
        if config.get(key):
            raise ConfigError(f"{where} uses {what}, which sandrl's engine does not serve; train a plain LoRA adapter")
    if config.get("bias", "none") != "none":
        raise ConfigError(f"{where} trains biases (bias={config['bias']!r}); train it with bias='none'")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= max_rank:
        raise ConfigError(
            f"{where}: r must be an integer from 1 to {max_rank} (the server's max_lora_rank), not {rank!r}"
        )
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not math.isfinite(alpha) or alpha <= 0:
        raise ConfigError(f"{where}: lora_alpha must be a finite number > 0, got {alpha!r}")
    return rank, float(alpha) / (math.sqrt(rank) if config.get("use_rslora") else rank)


def _read_pairs(
    weights: Path, linears: Mapping[str, torch.nn.Linear], rank: int, dtype: torch.dtype, where: str
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    try:
        return _checked_pairs(weights, linears, rank, dtype, where)
    except ConfigError:
        raise
    except Exception as exc:  # the safetensors library's own error type: a bad header, offsets past the end...
        raise ConfigError(f"{where}: {WEIGHTS_FILE} is not a readable safetensors file ({exc})") from None


def _checked_pairs(
    weights: Path, linears: Mapping[str, torch.nn.Linear], rank: int, dtype: torch.dtype, where: str
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    with safe_open(str(weights), framework="pt") as f:
        found: dict[str, dict[str, str]] = {}
        for key in sorted(f.keys()):
            match = _KEY.match(key)
            if match is None:
                raise ConfigError(
                    f"{where}: tensor {key[:120]!r} is not a LoRA A/B matrix of a linear layer "
                    "(base_model.model.<module>.lora_A.weight); only plain LoRA adapters are served"
                )
            module, part = match["module"], match["part"]
            layer = linears.get(module)
            if layer is None:
                raise ConfigError(
                    f"{where} adapts {module[:120]!r}, which is no linear layer of the served model: "
                    "the adapter was trained on another base model; serve that one"
                )
            tensor = f.get_slice(key)
            want = [rank, layer.in_features] if part == "A" else [layer.out_features, rank]
            if list(tensor.get_shape()) != want or tensor.get_dtype() not in _FLOAT_DTYPES:
                raise ConfigError(
                    f"{where}: {key[:120]} is {tensor.get_dtype()} {list(tensor.get_shape())}, but the served model "
                    f"needs a float {want} there (rank {rank}): the adapter does not fit this base model"
                )
            found.setdefault(module, {})[part] = key
        incomplete = sorted(m for m, parts in found.items() if len(parts) != 2)
        if incomplete or not found:
            what = f"{incomplete[0]!r} has only one of lora_A/lora_B" if incomplete else "it holds no LoRA matrices"
            raise ConfigError(f"{where}: {what}; export the adapter again")
        return {
            module: (f.get_tensor(keys["A"]).to(dtype).contiguous(), f.get_tensor(keys["B"]).to(dtype).contiguous())
            for module, keys in found.items()
        }


# -- the base an adapter belongs to ---------------------------------------------------------------


def _model_type(model: Any) -> str:
    return str(getattr(model.config, "model_type", "") or "")


def base_signature(state: Mapping[str, torch.Tensor], model_type: str, name: str = "") -> dict[str, Any]:
    """What identifies a base model for its adapters: its architecture, every tensor's name and shape
    (hashed), and a few of its values (which tell two models of the same shape apart).

    ``state`` is the base's state dict with the plain model's names (no ``peft`` wrapping).
    """
    names = sorted(state)
    shapes = "\n".join(f"{n}:{list(state[n].shape)}" for n in names)
    step = max(1, len(names) // _FINGERPRINT_TENSORS)
    fingerprint: dict[str, list[float]] = {}
    for key in names[::step][:_FINGERPRINT_TENSORS]:
        flat = state[key].detach().reshape(-1)
        if flat.numel() and flat.is_floating_point():
            at = torch.tensor([i * flat.numel() // _FINGERPRINT_VALUES for i in range(_FINGERPRINT_VALUES)])
            fingerprint[key] = [float(v) for v in flat.index_select(0, at.to(flat.device)).float().cpu()]
    return {
        "model_type": model_type,
        "name": name,
        "shapes_sha256": hashlib.sha256(shapes.encode()).hexdigest(),
        "fingerprint": fingerprint,
    }


def check_base(marker: Mapping[str, Any], served: Mapping[str, Any], where: str) -> None:
    """Refuse an adapter whose base (``marker``, from :data:`BASE_FILE`) is not the served model (``served``)."""
    trained = str(marker.get("name") or marker.get("model_type") or "another model")
    fix = (
        f"serve the model the adapter was trained on ({trained}), or export merged weights "
        '([train.lora] export = "merged") and load them with update_weights_from_disk'
    )
    if marker.get("model_type") != served["model_type"] or marker.get("shapes_sha256") != served["shapes_sha256"]:
        raise ConfigError(
            f"{where} was trained on another base model ({marker.get('model_type')!r}, shapes "
            f"{str(marker.get('shapes_sha256'))[:12]}) than the one served ({served['model_type']!r}, shapes "
            f"{served['shapes_sha256'][:12]}): {fix}"
        )
    values = marker.get("fingerprint")
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: {BASE_FILE} has no fingerprint; export the adapter again")
    for key, theirs in values.items():
        ours = served["fingerprint"].get(key)
        if (
            ours is None
            or not isinstance(theirs, list)
            or len(theirs) != len(ours)
            or any(
                not isinstance(t, int | float) or abs(t - o) > 1e-5 + 1e-2 * abs(o)
                for t, o in zip(theirs, ours, strict=True)
            )
        ):
            raise ConfigError(
                f"{where} was trained on a base model of the same shape but other weights ({key} differs): {fix}"
            )
