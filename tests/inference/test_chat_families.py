"""The real model families the fixtures rebuild: they load in sandrl's engine with the real eos lists."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sandrl.inference.engine import Engine
from sandrl.inference.tokenizer import HFTokenizer, model_tokenizer

from ..chat_families import FAMILIES, spec

EOS = {
    "qwen2.5": ["<|im_end|>", "<|endoftext|>"],
    "qwen3": ["<|im_end|>", "<|endoftext|>"],
    "glm45": ["<|endoftext|>", "<|user|>", "<|observation|>"],
    "llama3.1": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
}
"""``eos_token_id`` of each real model's generation_config.json, as strings."""


@pytest.mark.parametrize("family", FAMILIES)
async def test_the_model_loads_in_the_engine_with_the_real_eos_list(
    family: str, family_model_dir: Callable[[str], Path]
) -> None:
    path = family_model_dir(family)
    assert json.loads((path / "config.json").read_text())["architectures"] == [spec(family).architecture]
    tokenizer = model_tokenizer(path)
    assert isinstance(tokenizer, HFTokenizer)
    assert [tokenizer.decode([i]) for i in tokenizer.eos_token_ids] == EOS[family]
    async with Engine.load(str(path)) as engine:
        assert engine.tokenizer is not None and engine.tokenizer.eos_token_ids == tokenizer.eos_token_ids
        assert engine.vocab_size == tokenizer.vocab_size


@pytest.mark.parametrize("family", FAMILIES)
def test_the_tokenizer_keeps_the_real_special_flags(family: str, family_tokenizer_dir: Callable[[str], Path]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(family_tokenizer_dir(family)), local_files_only=True)
    fam = spec(family)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (fam.bos, fam.eos, fam.pad)
    for content, special in fam.added_tokens:
        ids = tok.encode(content, add_special_tokens=False)
        assert len(ids) == 1, f"{content} is not one token"
        assert (tok.decode(ids, skip_special_tokens=True) == "") is special, content


def test_tool_tags_survive_skipping_special_tokens_except_llamas(family_tokenizer_dir: Callable[[str], Path]) -> None:
    """Qwen's and GLM's tool-call tags are plain added tokens; Llama's <|python_tag|> is special."""
    from transformers import AutoTokenizer

    text = "<think>t</think><tool_call>c</tool_call><|python_tag|>p"
    kept = {}
    for family in FAMILIES:
        tok = AutoTokenizer.from_pretrained(str(family_tokenizer_dir(family)), local_files_only=True)
        kept[family] = tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=True)
    assert kept == {"qwen2.5": text, "qwen3": text, "glm45": text, "llama3.1": text.replace("<|python_tag|>", "")}


def test_llama_prepends_bos_when_asked_the_others_do_not(family_tokenizer_dir: Callable[[str], Path]) -> None:
    from transformers import AutoTokenizer

    for family in FAMILIES:
        tok = AutoTokenizer.from_pretrained(str(family_tokenizer_dir(family)), local_files_only=True)
        first = tok.convert_ids_to_tokens(tok.encode("hello")[:1])[0]
        assert (first == "<|begin_of_text|>") is (family == "llama3.1")
