"""Real model families, offline: their chat templates, special tokens and end-of-turn ids, with a tiny model.

A test that must hold for the models sandrl is trained on (Qwen2.5, Qwen3, GLM-4.5, Llama 3.1)
needs their tokenizers, but nothing here may download one. So each family is rebuilt from what
decides the chat format: the real, unmodified chat template (``tests/data/chat_templates/``; Llama 3.1's is read from
TRL's wheel at test time, see :data:`FETCHED`),
the real added tokens with their ``special`` flags, the real bos/eos/pad and the real
``generation_config.json`` eos lists. Only the ordinary vocabulary is small: a byte-level BPE
trained here on a corpus this module writes (shell commands, JSON tool calls, English, code).
Byte-level means any text encodes; the merges only keep the token counts realistic.

The token ids differ from the real models' (the vocabulary is a few hundred tokens, not 150k);
the strings, their special-ness and which ones end a turn do not.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from sandrl.inference.base import Generation, SamplingParams
from sandrl.inference.tokenizer import Tokenizer

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
LLAMA31_SHA256 = "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65"

FAMILIES = ("qwen2.5", "qwen3", "glm45", "llama3.1")

MERGES = 1000
"""BPE merges learned on top of the 256 byte tokens."""

_QWEN25_ADDED = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)
"""Qwen2.5's added tokens (ids 151643-151664), in id order. The tool-call tags are not special:
``skip_special_tokens=True`` keeps them, which is what lets servers parse tool calls."""

_QWEN3_ADDED = (
    *_QWEN25_ADDED,
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
"""Qwen3 adds the tool-response and think tags (ids 151665-151668), none of them special."""

_LLAMA31_ADDED = (
    ("<|begin_of_text|>", True),
    ("<|end_of_text|>", True),
    ("<|finetune_right_pad_id|>", True),
    ("<|start_header_id|>", True),
    ("<|end_header_id|>", True),
    ("<|eom_id|>", True),
    ("<|eot_id|>", True),
    ("<|python_tag|>", True),
)
"""The named ones of Llama 3.1's 256 reserved special tokens (the rest are unused placeholders).
All are special, ``<|python_tag|>`` included: decode with ``skip_special_tokens=False`` to see it."""

_GLM45_ADDED = (
    ("<|endoftext|>", True),
    ("[MASK]", True),
    ("[gMASK]", True),
    ("[sMASK]", True),
    ("<sop>", True),
    ("<eop>", True),
    ("<|system|>", True),
    ("<|user|>", True),
    ("<|assistant|>", True),
    ("<|observation|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<arg_key>", False),
    ("</arg_key>", False),
    ("<arg_value>", False),
    ("</arg_value>", False),
)
"""GLM-4.5's role and mask tokens are special; its think, tool-call and argument tags are plain
added tokens, as in the GLM-4 tokenizers on the Hub (transformers issue #48658 lists the split)."""


@dataclass(frozen=True)
class Family:
    """What a model family's chat format is made of."""

    name: str
    added_tokens: tuple[tuple[str, bool], ...]
    """(content, special) in the real model's id order."""
    bos: str | None
    eos: str
    """``eos_token`` of tokenizer_config.json (the instruct model's end of turn)."""
    pad: str | None
    generation_eos: tuple[str, ...]
    """``eos_token_id`` of generation_config.json: every token that ends a generation."""
    architecture: str
    """The transformers class of the tiny model."""
    parser: str
    """The sandrl tool-call parser of the format."""
    turn_end: str | None
    """The token the template closes an assistant turn with; None for GLM, whose turn ends where the
    next role token (``<|observation|>``, ``<|user|>``) begins, which is why those are eos tokens."""
    add_bos: bool = False
    """Whether encoding prepends bos (Llama's post-processor does; the templates write it anyway)."""

    @property
    def template(self) -> str:
        return template(self.name)


SPECS: dict[str, Family] = {
    "qwen2.5": Family(
        "qwen2.5", _QWEN25_ADDED, None, "<|im_end|>", "<|endoftext|>",
        ("<|im_end|>", "<|endoftext|>"), "Qwen2ForCausalLM", "hermes", "<|im_end|>",
    ),
    "qwen3": Family(
        "qwen3", _QWEN3_ADDED, None, "<|im_end|>", "<|endoftext|>",
        ("<|im_end|>", "<|endoftext|>"), "Qwen3ForCausalLM", "hermes", "<|im_end|>",
    ),
    "glm45": Family(
        "glm45", _GLM45_ADDED, None, "<|endoftext|>", "<|endoftext|>",
        ("<|endoftext|>", "<|user|>", "<|observation|>"), "Glm4MoeForCausalLM", "glm45", None,
    ),
    "llama3.1": Family(
        "llama3.1", _LLAMA31_ADDED, "<|begin_of_text|>", "<|eot_id|>", None,
        ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"), "LlamaForCausalLM", "llama3_json", "<|eot_id|>",
        add_bos=True,
    ),
}  # fmt: skip


def spec(family: str) -> Family:
    try:
        return SPECS[family]
    except KeyError:
        raise ValueError(f"unknown chat family {family!r}; the families are {', '.join(FAMILIES)}") from None


FETCHED = {"llama3.1": ("trl/chat_templates/llama3_1.jinja", LLAMA31_SHA256)}
"""Templates whose licence the project does not take on (see ``tests/data/chat_templates/README.md``):
read from TRL's wheel on PyPI at test time (path in the wheel, sha256 of the file), never stored here."""
TRL_WHEEL = "trl==1.16.0"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sandrl" / "chat-templates"


@cache
def template(family: str) -> str:
    """The family's real chat template, byte for byte."""
    name = spec(family).name
    if name not in FETCHED:
        return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
    member, sha256 = FETCHED[name]
    cached = CACHE / f"{name}.jinja"
    if not (cached.is_file() and hashlib.sha256(cached.read_bytes()).hexdigest() == sha256):
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_name(f"{cached.name}.{os.getpid()}.part")  # test processes may race here
        partial.write_bytes(_from_trl_wheel(member, sha256))
        os.replace(partial, cached)
    return cached.read_text(encoding="utf-8")


def _from_trl_wheel(member: str, sha256: str) -> bytes:
    """``member`` of TRL's pinned wheel (fetched by pip, so its index and certificates apply), checked."""
    with tempfile.TemporaryDirectory(prefix="sandrl-trl-wheel-") as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", tmp, TRL_WHEEL],
            capture_output=True,
            text=True,
            check=False,
        )
        wheels = list(Path(tmp).glob("trl-*.whl"))
        if proc.returncode != 0 or not wheels:
            raise RuntimeError(
                f"cannot fetch {TRL_WHEEL} from the package index for its chat template {member} "
                f"(pip said: {proc.stderr.strip()[-500:]}); the Llama 3.1 tests need it, and PyPI must be reachable"
            )
        with zipfile.ZipFile(wheels[0]) as wheel:
            data = wheel.read(member)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise RuntimeError(f"{member} in {wheels[0].name} is not the file the tests were written against (sha256)")
    return data


# -- the shared byte-level BPE ----------------------------------------------------------------

_ENGLISH = (
    "the a an of to in is it that for on with as was this be are by at from or have not but what all were when "
    "we there can your which their said if will each about how up out them then she many some so these would "
    "other into has more her two like him see time could no make than first been its who now people my made "
    "over did down only way find use may water long little very after words called just where most know file "
    "test tests error output command directory install build run fix bug function value list read write line"
)
_WORDS = tuple(_ENGLISH.split())
_COMMANDS = (
    "ls -la", "cd /workspace", "cat README.md", "grep -rn 'def main' src/", "python -m pytest -q tests/",
    "pip install -e .", "git status", "git diff HEAD~1", "find . -name '*.py' | head", "sed -n '1,40p' app.py",
    "echo \"done\" > out.txt", "make -j2 test", "head -c 200 /etc/os-release", "wc -l *.txt",
    "mkdir -p build && cd build", "python3 -c 'import sys; print(sys.version)'", "chmod +x run.sh && ./run.sh",
    "tail -n 20 log.txt",
)  # fmt: skip
_CODE = (
    "def main(argv: list[str]) -> int:\n    return 0\n",
    "for i in range(10):\n    print(i, end=' ')\n",
    "import json\nwith open('data.json') as f:\n    data = json.load(f)\n",
    "class Config:\n    def __init__(self, path):\n        self.path = path\n",
    "if __name__ == '__main__':\n    raise SystemExit(main(sys.argv[1:]))\n",
    '#include <stdio.h>\nint main(void) { printf("hi\\n"); return 0; }\n',
)
_TOOLS = ("bash", "read_file", "write_file", "search", "get_weather", "python")


def _corpus(seed: int = 0) -> list[str]:
    """A few hundred lines of what agents read and write, the same every run."""
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(300):
        words = rng.choices(_WORDS, k=rng.randint(5, 16))
        lines.append(" ".join(words).capitalize() + rng.choice(".?!:"))
        command = rng.choice(_COMMANDS)
        lines.append(command)
        call = {"name": rng.choice(_TOOLS), "arguments": {"command": command, "timeout": rng.randint(1, 600)}}
        lines.append(json.dumps(call))
        lines.append(f"<arg_key>path</arg_key>\n<arg_value>/workspace/{rng.choice(_WORDS)}.py</arg_value>")
        lines.append(rng.choice(_CODE))
    return lines


@cache
def _trained_backend_json() -> str:
    """The byte-level BPE, trained once per process (about 0.1 s), as tokenizer.json text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + MERGES, initial_alphabet=alphabet, show_progress=False, min_frequency=2
    )
    backend.train_from_iterator(_corpus(), trainer)
    return str(backend.to_str())


def _backend(family: Family) -> Any:
    from tokenizers import AddedToken, Tokenizer, processors

    backend = Tokenizer.from_str(_trained_backend_json())
    for content, special in family.added_tokens:
        token = AddedToken(content, special=special, normalized=False)
        if special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])
    if family.add_bos and family.bos is not None:
        bos_id = backend.token_to_id(family.bos)
        backend.post_processor = processors.TemplateProcessing(
            single=f"{family.bos}:0 $A:0",
            pair=f"{family.bos}:0 $A:0 {family.bos}:1 $B:1",
            special_tokens=[(family.bos, bos_id)],
        )
    else:
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    return backend


def build_tokenizer_dir(family: str, path: Path) -> Path:
    """Write ``family``'s tokenizer (tokenizer.json, tokenizer_config.json) and generation_config.json into ``path``."""
    fam = spec(family)
    path.mkdir(parents=True, exist_ok=True)
    backend = _backend(fam)
    backend.save(str(path / "tokenizer.json"))
    ids = {content: backend.token_to_id(content) for content, _ in fam.added_tokens}
    config = {
        "added_tokens_decoder": {
            str(ids[content]): {
                "content": content, "lstrip": False, "normalized": False, "rstrip": False,
                "single_word": False, "special": special,
            }
            for content, special in fam.added_tokens
        },
        "bos_token": fam.bos,
        "eos_token": fam.eos,
        "pad_token": fam.pad,
        "chat_template": fam.template,
        # Llama 3.1 ships True, which transformers 5 ignores for BPE (with a warning): it would turn " ," into ",".
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }  # fmt: skip
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (path / "generation_config.json").write_text(json.dumps(_generation_config(fam, ids), indent=2) + "\n")
    return path


def _generation_config(fam: Family, ids: dict[str, int]) -> dict[str, Any]:
    generation: dict[str, Any] = {"eos_token_id": [ids[t] for t in fam.generation_eos]}
    if fam.bos is not None:
        generation["bos_token_id"] = ids[fam.bos]
    if fam.pad is not None:
        generation["pad_token_id"] = ids[fam.pad]
    return generation


def vocab_size(family: str) -> int:
    """How many tokens ``family``'s tokenizer has (the model's vocabulary size)."""
    return int(_backend(spec(family)).get_vocab_size(with_added_tokens=True))


def build_model_dir(family: str, path: Path, *, seed: int = 0) -> Path:
    """``family``'s tokenizer plus a tiny random-weight model of the family's architecture, saved with
    ``save_pretrained``; the same seed gives the same weights."""
    import torch
    import transformers

    fam = spec(family)
    build_tokenizer_dir(family, path)
    generation = json.loads((path / "generation_config.json").read_text())
    common: dict[str, Any] = {
        "vocab_size": vocab_size(family), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
        "bos_token_id": generation.get("bos_token_id"), "eos_token_id": generation["eos_token_id"],
        "pad_token_id": generation.get("pad_token_id"),
    }  # fmt: skip
    if fam.architecture == "Glm4MoeForCausalLM":
        # The real GLM-4.5 layout at toy size: a dense first layer, then a routed MoE layer with a shared expert.
        config: Any = transformers.Glm4MoeConfig(
            **{**common, "num_hidden_layers": 2}, moe_intermediate_size=16, n_routed_experts=4,
            num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, head_dim=8,
            partial_rotary_factor=0.5, use_qk_norm=False,
        )  # fmt: skip
    elif fam.architecture == "Qwen3ForCausalLM":
        config = transformers.Qwen3Config(**common, head_dim=8)
    elif fam.architecture == "Qwen2ForCausalLM":
        config = transformers.Qwen2Config(**common)
    else:
        config = transformers.LlamaConfig(**common)
    model_cls = getattr(transformers, fam.architecture)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    model.generation_config = transformers.GenerationConfig(**generation)
    model.save_pretrained(str(path))
    return path


BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
"""An OpenAI tool schema the families' templates render."""


@dataclass
class TemplateReplies:
    """A policy whose replies are the template's own renderings of given assistant messages; it
    records each prompt it is given."""

    tok: Tokenizer
    replies: Sequence[list[int]]
    calls: list[list[int]] = field(default_factory=list)
    max_context: int | None = 8192

    @property
    def tokenizer(self) -> Tokenizer:
        return self.tok

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        ids = list(self.replies[min(len(self.calls), len(self.replies) - 1)])
        self.calls.append(list(input_ids))
        return Generation(ids, [-0.5] * len(ids), "stop", 0, len(input_ids))

    async def update_weights(self, path: str, *, version: int | None = None) -> int:
        raise NotImplementedError

    async def health(self) -> None:
        return None
