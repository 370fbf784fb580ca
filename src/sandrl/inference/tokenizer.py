"""Tokenizers: a byte-level one with a ChatML-like template, and an adapter for Hugging Face ones.

The byte tokenizer is what models built from a config (``tiny``) use: ids 0-255 are the
bytes of UTF-8 text, so any text round-trips exactly and no vocabulary file is needed;
a few special tokens follow. User text never encodes to a special token, so a message
cannot forge a turn boundary. A Hugging Face tokenizer's vocabulary can spell its special
tokens in text, so :class:`HFTokenizer` renders messages through
:class:`~sandrl.inference.literal_content.LiteralContentTemplate` for the same guarantee.

The chat template renders each turn on its own and turns simply follow one another::

    <|bos|><|im_start|>system\\nYou are...<|im_end|><|im_start|>user\\nls<|im_end|><|im_start|>assistant\\n

There is no separator after ``<|im_end|>``, so the ids of a conversation are exactly the
concatenation of its turns: a multi-turn agent appends the model's output (which ends in
``<|im_end|>``), then ``encode_turn("tool", observation)``, then ``assistant_prefix_ids()``,
and never re-tokenizes an earlier turn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from sandrl.errors import ConfigError
from sandrl.inference.literal_content import LiteralContentTemplate

Message = Mapping[str, Any]
"""A chat message in OpenAI's shape: ``{"role", "content"}``, plus ``tool_calls`` on an assistant
message and ``tool_call_id`` / ``name`` on a ``tool`` message."""

Tools = Sequence[Mapping[str, Any]]
"""Tool specs in OpenAI's shape: ``[{"type": "function", "function": {"name", "description", "parameters"}}]``."""

TOKENIZER_FILE = "sandrl_tokenizer.json"
"""Marker written next to a checkpoint whose model uses the byte tokenizer."""

TINY = "tiny"
"""The model name that builds :class:`~sandrl.inference.model.TinyModelConfig`'s model (byte tokenizer)."""


@runtime_checkable
class Tokenizer(Protocol):
    """What the engine and the server need from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Tokens that end generation unless a request says ``ignore_eos``."""
        ...

    @property
    def pad_token_id(self) -> int: ...

    def encode(self, text: str) -> list[int]:
        """Ids of a text prompt as a server tokenizes one (``/v1/completions``, ``/generate``): no bos added,
        and a Hugging Face tokenizer's added tokens written in the text are matched, as SGLang and vLLM do."""
        ...

    def encode_text(self, text: str) -> list[int]:
        """Ids of ``text`` as message content encodes: all of it text, never a special or added token."""
        ...

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str: ...

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (its UTF-8 text for a special token)."""
        ...

    def encode_messages(
        self, messages: Sequence[Message], *, add_generation_prompt: bool = False, tools: Tools | None = None
    ) -> list[int]:
        """Render a conversation with the chat template; ``tools`` are offered as the template offers them.

        Message content (and tools) encodes as text (:meth:`encode_text`): only the template's own
        structure holds special tokens (:mod:`sandrl.inference.literal_content` says why and how)."""
        ...

    @property
    def chat_template(self) -> str | None:
        """The chat template's source text (what a tool-call format is detected from); None for built-in ones."""
        ...

    def save(self, directory: str | Path) -> None:
        """Write this tokenizer into a checkpoint directory, where :func:`load_tokenizer` finds it."""
        ...


class ByteTokenizer:
    """256 byte tokens followed by the special tokens; see the module docstring for the template."""

    SPECIAL_TOKENS: tuple[str, ...] = ("<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>")

    def __init__(self) -> None:
        self._special_ids = {name: 256 + i for i, name in enumerate(self.SPECIAL_TOKENS)}
        self._special_names = {i: name for name, i in self._special_ids.items()}

    # -- ids of the special tokens -------------------------------------------------------------

    @property
    def pad_token_id(self) -> int:
        return self._special_ids["<|pad|>"]

    @property
    def bos_token_id(self) -> int:
        return self._special_ids["<|bos|>"]

    @property
    def eos_token_id(self) -> int:
        return self._special_ids["<|eos|>"]

    @property
    def im_start_id(self) -> int:
        return self._special_ids["<|im_start|>"]

    @property
    def im_end_id(self) -> int:
        return self._special_ids["<|im_end|>"]

    @property
    def vocab_size(self) -> int:
        return 256 + len(self.SPECIAL_TOKENS)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        # <|im_end|> closes an assistant turn, so it must stop generation like <|eos|>.
        return (self.eos_token_id, self.im_end_id)

    # -- text --------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_text(self, text: str) -> list[int]:
        return self.encode(text)  # bytes: no text is a special token

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        # Bytes are gathered first because one character spans several byte tokens; a model
        # may emit invalid UTF-8, which decodes to U+FFFD rather than failing.
        parts: list[str] = []
        pending = bytearray()
        for token_id in ids:
            if 0 <= token_id < 256:
                pending.append(token_id)
                continue
            name = self._special_names.get(token_id)
            if name is None:
                raise ConfigError(
                    f"token id {token_id} is outside the byte tokenizer's vocabulary (0-{self.vocab_size - 1})"
                )
            if pending:
                parts.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
            if not skip_special_tokens:
                parts.append(name)
        if pending:
            parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)

    def token_bytes(self, token_id: int) -> bytes:
        if 0 <= token_id < 256:
            return bytes([token_id])
        name = self._special_names.get(token_id)
        if name is None:
            raise ConfigError(
                f"token id {token_id} is outside the byte tokenizer's vocabulary (0-{self.vocab_size - 1})"
            )
        return name.encode()

    # -- chat template -------------------------------------------------------------------------

    def encode_turn(self, role: str, text: str) -> list[int]:
        """One complete turn: ``<|im_start|>role\\ntext<|im_end|>``."""
        if not role or "\n" in role:
            raise ConfigError(f"a chat role must be a non-empty single line, got {role!r}")
        return [self.im_start_id, *self.encode(role + "\n"), *self.encode(text), self.im_end_id]

    def assistant_prefix_ids(self) -> list[int]:
        """What opens the assistant's turn; the model's output follows and ends with ``<|im_end|>``."""
        return [self.im_start_id, *self.encode("assistant\n")]

    def encode_messages(
        self, messages: Sequence[Message], *, add_generation_prompt: bool = False, tools: Tools | None = None
    ) -> list[int]:
        ids = [self.bos_token_id]
        listed = list(messages)
        if tools:
            section = render_tools(tools)
            if listed and listed[0].get("role") == "system":
                listed[0] = {**listed[0], "content": _field(listed[0], "content") + "\n\n" + section}
            else:
                listed.insert(0, {"role": "system", "content": section})
        for message in listed:
            ids += self.encode_turn(_field(message, "role"), message_text(message))
        if add_generation_prompt:
            ids += self.assistant_prefix_ids()
        return ids

    @property
    def chat_template(self) -> str | None:
        return None

    def parse_messages(self, ids: Sequence[int]) -> tuple[list[dict[str, str]], bool]:
        """Invert :meth:`encode_messages`: the messages, and whether an open assistant turn ends the ids."""
        pos = 1 if ids and ids[0] == self.bos_token_id else 0
        messages: list[dict[str, str]] = []
        while pos < len(ids):
            if ids[pos] != self.im_start_id:
                raise ConfigError(f"not a chat rendering: expected <|im_start|> at position {pos}, got id {ids[pos]}")
            try:
                end = list(ids).index(self.im_end_id, pos)
            except ValueError:
                end = -1
            body = bytes(t for t in ids[pos + 1 : end if end >= 0 else len(ids)] if t < 256)
            role, newline, content = body.decode("utf-8", errors="replace").partition("\n")
            if end < 0:
                if role == "assistant" and newline and not content:
                    return messages, True
                raise ConfigError("not a chat rendering: the last turn is not closed by <|im_end|>")
            messages.append({"role": role, "content": content})
            pos = end + 1
        return messages, False

    # -- on disk -------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> None:
        """Write the marker that tells :func:`load_tokenizer` this checkpoint uses the byte tokenizer."""
        spec = {"type": "byte", "special_tokens": list(self.SPECIAL_TOKENS)}
        (Path(directory) / TOKENIZER_FILE).write_text(json.dumps(spec, indent=2) + "\n")


class HFTokenizer:
    """A Hugging Face tokenizer loaded from a local directory, seen through the :class:`Tokenizer` protocol."""

    def __init__(self, hf_tokenizer: Any, eos_token_ids: Sequence[int] = ()) -> None:
        self._tok = hf_tokenizer
        ids = [int(i) for i in eos_token_ids]
        if not ids and hf_tokenizer.eos_token_id is not None:
            ids = [int(hf_tokenizer.eos_token_id)]
        self._eos = tuple(dict.fromkeys(ids))
        self._literal: LiteralContentTemplate | None = None

    @classmethod
    def from_dir(cls, directory: str | Path, eos_token_ids: Sequence[int] = ()) -> HFTokenizer:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load the tokenizer in {directory}: {exc}") from exc
        return cls(tok, eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos

    @property
    def pad_token_id(self) -> int:
        pad = self._tok.pad_token_id
        return int(pad) if pad is not None else (self._eos[0] if self._eos else 0)

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self._tok.encode(text, add_special_tokens=False)]

    def encode_text(self, text: str) -> list[int]:
        return self._literal_template().encode_text(text)

    def _literal_template(self) -> LiteralContentTemplate:
        if self._literal is None:
            self._literal = LiteralContentTemplate(self._tok)
        return self._literal

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_bytes(self, token_id: int) -> bytes:
        return self.decode([token_id]).encode("utf-8")

    @property
    def chat_template(self) -> str | None:
        template = getattr(self._tok, "chat_template", None)
        if isinstance(template, dict):  # named templates: the default one, else the tool-use one
            template = template.get("default") or template.get("tool_use")
        return template if isinstance(template, str) else None

    def encode_messages(
        self, messages: Sequence[Message], *, add_generation_prompt: bool = False, tools: Tools | None = None
    ) -> list[int]:
        if self.chat_template is None:
            raise ConfigError("this checkpoint's tokenizer has no chat template; use /v1/completions or /generate")
        return self._literal_template().encode_messages(
            messages, add_generation_prompt=add_generation_prompt, tools=tools
        )

    def save(self, directory: str | Path) -> None:
        self._tok.save_pretrained(str(directory))


def load_tokenizer(directory: str | Path, eos_token_ids: Sequence[int] = ()) -> Tokenizer | None:
    """The tokenizer stored with a checkpoint: the byte tokenizer's marker, else Hugging Face files, else None."""
    path = Path(directory)
    if (path / TOKENIZER_FILE).is_file():
        spec = json.loads((path / TOKENIZER_FILE).read_text())
        if spec.get("type") != "byte":
            raise ConfigError(f"{path / TOKENIZER_FILE}: unknown tokenizer type {spec.get('type')!r} (expected 'byte')")
        return ByteTokenizer()
    if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
        return HFTokenizer.from_dir(path, eos_token_ids)
    return None


TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


def render_tools(tools: Tools) -> str:
    """The byte template's tool section: one line per tool, its signature and description.

    Compact on purpose: every character is a token of a small model's context. A call is the
    Hermes/Qwen format (``<tool_call>{"name", "arguments"}</tool_call>``), parsed by the ``hermes`` parser."""
    lines = ["# Tools", f'{TOOL_CALL_OPEN}\n{{"name": "<tool>", "arguments": {{...}}}}\n{TOOL_CALL_CLOSE}']
    for tool in tools:
        function = tool.get("function", tool)
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a tool spec needs a function name, got {dict(tool)!r}")
        params = function.get("parameters") or {}
        required = set(params.get("required") or ())
        args = ", ".join(
            f"{key}{'' if key in required else '?'}: {spec.get('type', 'any') if isinstance(spec, Mapping) else 'any'}"
            for key, spec in (params.get("properties") or {}).items()
        )
        description = str(function.get("description") or "").strip()
        lines.append(f"{name}({args})" + (f" - {description}" if description else ""))
    return "\n".join(lines)


def message_text(message: Message) -> str:
    """What the byte template writes for a message: its content, then its tool calls in the Hermes format."""
    content = message.get("content")
    calls = message.get("tool_calls") or ()
    if content is None and calls:
        content = ""
    if not isinstance(content, str):
        raise ConfigError(f"a chat message needs a string 'content' (or null with tool calls), got {dict(message)!r}")
    parts = [content] if content else []
    for call in calls:
        function = call.get("function", call) if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ConfigError(f"a tool call needs a function name, got {call!r}")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError as exc:
                raise ConfigError(f"tool call arguments are not JSON: {arguments[:200]!r}") from exc
        body = json.dumps({"name": function["name"], "arguments": arguments}, ensure_ascii=False)
        parts.append(f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}")
    return "\n".join(parts)


def _field(message: Message, key: str) -> str:
    value = message.get(key)
    if not isinstance(value, str):
        raise ConfigError(f"a chat message needs a string {key!r}, got {dict(message)!r}")
    return value


def model_tokenizer(model: str | Path, eos_token_ids: Sequence[int] | None = None) -> Tokenizer | None:
    """The tokenizer of the model named ``model`` (``tiny`` or a checkpoint directory); None if it has none.

    This is the one place a model name becomes a tokenizer: the engine loading a checkpoint and
    a client of a server that serves it must agree on the ids. ``eos_token_ids`` are the model's
    end-of-sequence tokens; by default they are read from the checkpoint's generation and model
    configs, as the engine's model has them.
    """
    if str(model) == TINY:
        return ByteTokenizer()
    path = Path(model).expanduser()
    return load_tokenizer(path, _checkpoint_eos_ids(path) if eos_token_ids is None else eos_token_ids)


def _checkpoint_eos_ids(path: Path) -> list[int]:
    # generation_config.json wins over config.json, as in transformers' generation config.
    for name in ("generation_config.json", "config.json"):
        try:
            eos = json.loads((path / name).read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(eos, int) and not isinstance(eos, bool):
            return [eos]
        if isinstance(eos, list) and eos and all(isinstance(e, int) for e in eos):
            return [int(e) for e in eos]
    return []
