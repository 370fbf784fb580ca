"""The policy's weights: a deterministic tiny model, checkpoints on disk, clear errors for bad paths."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sandrl.errors import ConfigError
from sandrl.inference.model import build_tiny_model, load_model, load_weights, save_weights
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.inference.tokenizer import ByteTokenizer


def _weights_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tiny_model_is_a_function_of_its_seed() -> None:
    a, tok = build_tiny_model(TinyModelConfig(seed=7))
    torch.rand(100)  # whatever ran before must not matter
    b, _ = build_tiny_model(TinyModelConfig(seed=7))
    c, _ = build_tiny_model(TinyModelConfig(seed=8))
    assert _weights_equal(a, b)
    assert not _weights_equal(a, c)
    assert a.config.vocab_size == tok.vocab_size == ByteTokenizer().vocab_size


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_both_architectures_build_and_run(architecture: str) -> None:
    model, tok = build_tiny_model(TinyModelConfig(architecture=architecture))  # type: ignore[arg-type]
    logits = model(input_ids=torch.tensor([tok.encode("hello")])).logits
    assert logits.shape == (1, 5, tok.vocab_size)


def test_save_then_load_gives_the_same_model(tmp_path: Path) -> None:
    model, tok = build_tiny_model(TinyModelConfig(seed=3))
    path = save_weights(model, tmp_path / "ckpt", tok)
    assert (path / "config.json").is_file() and list(path.glob("*.safetensors"))
    loaded, loaded_tok, where = load_model(str(path))
    assert where == str(path.resolve())
    assert isinstance(loaded_tok, ByteTokenizer)
    ids = torch.tensor([tok.encode("same logits")])
    with torch.inference_mode():
        assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)


def test_save_replaces_an_existing_checkpoint_whole(tmp_path: Path) -> None:
    first, tok = build_tiny_model(TinyModelConfig(seed=1))
    second, _ = build_tiny_model(TinyModelConfig(seed=2))
    save_weights(first, tmp_path / "ckpt", tok)
    save_weights(second, tmp_path / "ckpt", tok)
    assert _weights_equal(load_model(str(tmp_path / "ckpt"))[0], second)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"], "no staging directory may be left behind"


def test_missing_model_path_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist: pass 'tiny' or a local Hugging Face checkpoint"):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="never downloads"):
        load_model("Qwen/Qwen2.5-0.5B-Instruct")


def test_a_directory_without_a_checkpoint_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not a checkpoint directory: it needs a config.json"):
        load_model(str(tmp_path))


def test_weights_of_another_shape_do_not_fit(tmp_path: Path) -> None:
    served, _ = build_tiny_model(TinyModelConfig())
    wider, tok = build_tiny_model(TinyModelConfig(hidden_size=96))
    path = save_weights(wider, tmp_path / "wider", tok)
    with pytest.raises(ConfigError, match="do not fit the served model"):
        load_weights(served, str(path))


def _hf_checkpoint(path: Path) -> Path:
    """A checkpoint with a Hugging Face tokenizer (word level, with a chat template), as real models ship."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = ["<unk>", "<eos>", "<user>", "<bot>", "hello", "world", "how", "are", "you", "fine", "thanks"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece()
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")
    hf_tok.add_special_tokens({"additional_special_tokens": ["<user>", "<bot>"]})
    hf_tok.chat_template = (
        "{% for m in messages %}{{ '<user>' if m['role'] == 'user' else '<bot>' }} {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<bot>{% endif %}"
    )
    config = transformers.LlamaConfig(
        vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128, eos_token_id=1,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(str(path))
    hf_tok.save_pretrained(str(path))
    return path


async def test_a_checkpoint_with_a_hugging_face_tokenizer_is_served(tmp_path: Path) -> None:
    import httpx

    from sandrl.inference.engine import Engine
    from sandrl.inference.server import create_app
    from sandrl.inference.tokenizer import HFTokenizer

    path = _hf_checkpoint(tmp_path / "hf")
    async with Engine.load(str(path)) as engine:
        tok = engine.tokenizer
        assert isinstance(tok, HFTokenizer) and tok.eos_token_ids == (1,)
        assert tok.encode("hello you") == [4, 8] and tok.decode([4, 8]) == "hello you"
        assert tok.encode_messages([{"role": "user", "content": "hello"}], add_generation_prompt=True) == [2, 4, 3]
        app = create_app(engine)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
            r = await http.post(
                "/v1/chat/completions",
                json={"model": "hf", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5, "seed": 1},
            )
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["prompt_tokens"] == 3
            r = await http.post("/generate", json={"text": "how are you", "sampling_params": {"max_new_tokens": 3}})
            assert r.json()["meta_info"]["prompt_tokens"] == 3
