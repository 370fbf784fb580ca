"""The policy's weights: build a tiny model from a config, load a local checkpoint, save one.

On disk a policy is a Hugging Face ``save_pretrained`` directory (``config.json`` and
``model.safetensors``) plus its tokenizer: Hugging Face tokenizer files, or, for models
built from a config, the byte tokenizer's marker file (:data:`~sandrl.inference.tokenizer.TOKENIZER_FILE`).
The trainer writes one with :func:`save_weights`; the engine loads it with :func:`load_model`
at start and with :func:`load_weights` on ``update_weights_from_disk``.

Nothing here downloads: a path that is not a local directory is an error.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers

from sandrl.errors import ConfigError, InferenceError
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.inference.tokenizer import TINY, ByteTokenizer, Tokenizer, model_tokenizer

# Weights are saved and loaded on every policy update; transformers' per-call progress bars
# ("Writing model shards", "Loading weights") would flood the trainer's own progress display.
transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]

# transformers 5 renamed from_pretrained's ``torch_dtype`` to ``dtype`` and warns on the old name.
_DTYPE_KWARG = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"


def build_tiny_model(config: TinyModelConfig | None = None) -> tuple[Any, ByteTokenizer]:
    """A randomly initialised model whose vocabulary is the byte tokenizer's, and that tokenizer."""
    cfg = config or TinyModelConfig()
    tokenizer = ByteTokenizer()
    kwargs: dict[str, Any] = {
        "vocab_size": tokenizer.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": True,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": list(tokenizer.eos_token_ids),
        "pad_token_id": tokenizer.pad_token_id,
    }
    if cfg.architecture == "llama":
        hf_config: Any = transformers.LlamaConfig(**kwargs)
        model_cls: Any = transformers.LlamaForCausalLM
    elif cfg.architecture == "qwen2":
        hf_config = transformers.Qwen2Config(**kwargs)
        model_cls = transformers.Qwen2ForCausalLM
    elif cfg.architecture == "qwen3":
        hf_config = transformers.Qwen3Config(head_dim=cfg.hidden_size // cfg.num_heads, **kwargs)
        model_cls = transformers.Qwen3ForCausalLM
    else:
        raise ConfigError(f"unknown tiny architecture {cfg.architecture!r}: use 'llama', 'qwen2' or 'qwen3'")
    # Forking the RNG makes the weights depend on the seed alone, not on what ran before.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = model_cls(hf_config)
    return model.to(torch.float32).eval(), tokenizer


def load_model(model: str, *, tiny: TinyModelConfig | None = None) -> tuple[Any, Tokenizer | None, str]:
    """The model named ``model`` (``tiny`` or a local checkpoint directory), its tokenizer, and its path.

    The tokenizer is None for a checkpoint stored without one: such a model can still be
    served token-in token-out (SGLang's ``/generate`` with ``input_ids``).
    """
    if model == TINY:
        tiny_net, byte_tokenizer = build_tiny_model(tiny)
        return tiny_net, byte_tokenizer, TINY
    path = _checkpoint_dir(model)
    net = _from_pretrained(path)
    tokenizer = model_tokenizer(path, _eos_ids(net))
    if tokenizer is not None and tokenizer.vocab_size > net.config.vocab_size:
        raise ConfigError(
            f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model only {net.config.vocab_size}; "
            "the tokenizer files do not belong to this model"
        )
    return net, tokenizer, str(path)


def load_weights(model: Any, path: str) -> dict[str, torch.Tensor]:
    """The state dict of the checkpoint at ``path``, checked to fit ``model`` (same names and shapes)."""
    new = _from_pretrained(_checkpoint_dir(path)).state_dict()
    old = model.state_dict()
    missing = sorted(set(old) - set(new))
    unexpected = sorted(set(new) - set(old))
    mismatched = sorted(k for k in set(old) & set(new) if old[k].shape != new[k].shape)
    if missing or unexpected or mismatched:
        details = "; ".join(
            f"{label}: {', '.join(keys[:3])}{'...' if len(keys) > 3 else ''}"
            for label, keys in (("missing", missing), ("unexpected", unexpected), ("other shape", mismatched))
            if keys
        )
        raise ConfigError(
            f"the weights in {path} do not fit the served model ({details}); "
            "export them from the same architecture the server was started with"
        )
    return {k: v.to(old[k].dtype) for k, v in new.items()}


def save_weights(
    model: Any,
    path: str | Path,
    tokenizer: Tokenizer | None = None,
    *,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``model`` (and its tokenizer) as a checkpoint directory that :func:`load_model` and
    ``update_weights_from_disk`` read. The directory appears complete or not at all: it is
    written beside ``path`` and renamed into place, so a server never loads half a checkpoint.
    ``state_dict`` replaces the model's own weights (a sharded model's, gathered)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        if state_dict is None:
            model.save_pretrained(str(staging))
        else:
            model.save_pretrained(str(staging), state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _checkpoint_dir(model: str) -> Path:
    path = Path(model).expanduser()
    if not path.exists():
        raise ConfigError(
            f"model path {model} does not exist: pass 'tiny' or a local Hugging Face checkpoint directory "
            "(config.json + *.safetensors); sandrl never downloads weights, so fetch a hub model beforehand"
        )
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ConfigError(
            f"model path {model} is not a checkpoint directory: it needs a config.json and *.safetensors "
            "(as written by save_pretrained or sandrl.inference.model.save_weights)"
        )
    return path.resolve()


def _from_pretrained(path: Path) -> Any:
    try:
        model: Any = transformers.AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, **{_DTYPE_KWARG: torch.float32}
        )
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot load the checkpoint in {path}: {exc}") from exc
    except RuntimeError as exc:
        raise InferenceError(f"loading the checkpoint in {path} failed: {exc}") from exc
    return model.eval()


def _eos_ids(model: Any) -> list[int]:
    eos = getattr(model.generation_config, "eos_token_id", None) or model.config.eos_token_id
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


def config_eos_ids(model: Any) -> list[int]:
    """The end-of-sequence ids a model's config names (for checkpoints without a tokenizer)."""
    eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]
