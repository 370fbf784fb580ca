"""Message content encodes as text, never as one of the tokenizer's special or added tokens.

A conversation's messages are not the model's: a tool message holds what a sandbox printed, a
user message what a harness forwarded, an assistant's tool-call arguments what a client sent
back. Rendered by a chat template into one string and tokenized with special tokens matched
(what ``apply_chat_template(tokenize=True)`` does, and what SGLang's and vLLM's OpenAI servers
do with the rendered prompt), a tool output holding ``<|im_end|>\\n<|im_start|>assistant\\n...``
becomes real ``<|im_end|>`` and ``<|im_start|>`` ids: sandboxed code writes assistant and user
turns into the model's context and into the recorded trajectory. sandrl does not follow those
servers here: a token the template did not write itself is never a control token. (The byte
tokenizer needs none of this: its text is bytes, and no byte sequence is a special token.)

How, for a Hugging Face tokenizer (:class:`LiteralContentTemplate`):

1. **Escape.** Every string of the messages and tools (values, dict keys and roles alike) has
   each occurrence of an added token's text (special or not, whitespace-only ones excepted)
   replaced by a *marker*: a private-use character, the index of the text in a table made for
   this rendering, another private-use character. The marker characters themselves, found in a
   string, are escaped the same way, so every marker in a rendering is one made here. So are a
   string's end that begins an added token (``"...<|im_"``) and its start that ends one
   (``"end|>..."``): content cannot complete a token with the template's text beside it.
2. **Render** the escaped messages with the template, to text. Where the content had a token's
   text, the template sees a marker: a template that looks for a token in content (Qwen3's
   ``'</think>' in content``) no longer finds one, which is the point.
3. **Tokenize** that text as ``apply_chat_template`` does. Every added token in it is the
   template's own. A tokenizer encodes the stretches of text between added tokens each on its
   own; a stretch that holds a marker is encoded again, the markers replaced by their text and
   no added token matched, and those ids replace the stretch's.

What is exact: content with no added token's text (nor one's start or end at its edges) leaves
no marker, and the ids are ``apply_chat_template(tokenize=True)``'s, bit for bit. Content with
such text: its stretch is encoded whole, template text and content together, so no BPE merge is
cut at the content's edges; the ids are those the tokenizer would give that stretch if the
added tokens were not in its vocabulary (a stretch that does not start the text is encoded after
a seam token, as one that does not start it: SentencePiece's Metaspace adds its prefix space to
the first only), and the ids decode back to the text the template rendered.

Why not transformers' ``apply_chat_template(sanitize_control_tokens=True)`` (5.2x): it needs a
newer transformers than sandrl requires; it treats as control tokens the special ones and only
those added tokens the template's text holds (Qwen2.5's ``<|fim_prefix|>`` in content stays a
token); it leaves dict keys as they are (tool-call arguments' and tool schemas' keys are
rendered); and it encodes the text on either side of a marked token apart (a BPE seam there).

What it does not cover: a template that builds a token from parts of a message (Phi-4's
``'<|' + message['role'] + '|>'``) still makes one from a role such as ``end``; none of the
families sandrl is tested with does. Whitespace added tokens (Gemma's ``"\\n"``) are how such a
tokenizer writes whitespace and stay matched. A template that cuts a marker, or JSON-escapes it
with ``ensure_ascii``, leaves the marker's characters as text: the content's token text is then
lost from the rendering, never turned into a token. A Python (slow) tokenizer, with no offsets to
find the template's tokens by, refuses content holding token text (:class:`ConfigError`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sandrl.errors import ConfigError

_OPEN = "\U0010fffa"
_CLOSE = "\U0010fffb"
"""The marker's ends: private-use characters (plane 16), which no template or tokenizer writes."""

_MARKER = re.compile(f"{_OPEN}([0-9]+){_CLOSE}")

_SEAM = "\U0010fffc\U0010fffd"
"""An added token of the plain encoder only: a stretch encoded after it is encoded as one that does
not start the text (SentencePiece's Metaspace adds its prefix space to the text's first stretch only)."""


class LiteralContentTemplate:
    """A Hugging Face tokenizer's chat template, rendered so that message content is literal text.

    See the module docstring; :class:`~sandrl.inference.tokenizer.HFTokenizer` holds one."""

    def __init__(self, hf_tokenizer: Any) -> None:
        self._tok = hf_tokenizer
        decoder: Mapping[int, Any] = hf_tokenizer.added_tokens_decoder
        self._added_ids = frozenset(int(i) for i in decoder)
        texts = sorted({str(t.content) for t in decoder.values() if str(t.content).strip()}, key=len, reverse=True)
        for text in texts:
            if _OPEN in text or _CLOSE in text or _SEAM in text:
                raise ConfigError(f"the tokenizer has an added token {text!r} made of sandrl's private-use markers")
        escaped = set(texts)
        unknown = hf_tokenizer.unk_token_id
        self._escaped_ids = frozenset(int(i) for i, t in decoder.items() if str(t.content) in escaped and i != unknown)
        self._pattern = re.compile("|".join([re.escape(_OPEN), re.escape(_CLOSE), *map(re.escape, texts)]))
        # A token's start at the content's end, its end at the content's start; not where that edge is
        # whitespace, which a template may strip (so a marker there would change the clean rendering).
        self._starts = frozenset(t[:k] for t in texts for k in range(1, len(t)) if not t[k - 1].isspace())
        self._ends = frozenset(t[k:] for t in texts for k in range(1, len(t)) if not t[k].isspace())
        self._longest = max((len(t) for t in texts), default=1)
        self._plain: dict[bool, Any] = {}

    # -- escaping ---------------------------------------------------------------------------

    def escape(self, value: Any, table: list[str]) -> Any:
        """``value`` (a message, tools, any JSON value) with its strings escaped into ``table``; see step 1."""
        if isinstance(value, str):
            return self._escape_text(value, table)
        if isinstance(value, Mapping):
            return {self.escape(k, table): self.escape(v, table) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.escape(v, table) for v in value]
        return value

    def _escape_text(self, text: str, table: list[str]) -> str:
        spans = [m.span() for m in self._pattern.finditer(text)]
        head, tail = self._edge(text, self._ends, at_start=True), self._edge(text, self._starts, at_start=False)
        if head:
            spans.insert(0, (0, head))
        if tail:
            spans.append((len(text) - tail, len(text)))
        if not spans:
            return text
        merged: list[list[int]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        out, pos = [], 0
        for start, end in merged:
            table.append(text[start:end])
            out += [text[pos:start], f"{_OPEN}{len(table) - 1}{_CLOSE}"]
            pos = end
        out.append(text[pos:])
        return "".join(out)

    def _edge(self, text: str, pieces: frozenset[str], *, at_start: bool) -> int:
        """The length of the longest start (or end) of ``text`` that is in ``pieces``; 0 when none is."""
        for k in range(min(self._longest - 1, len(text)), 0, -1):
            if (text[:k] if at_start else text[-k:]) in pieces:
                return k
        return 0

    # -- rendering and encoding ---------------------------------------------------------------

    def encode_messages(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool, tools: Any = None
    ) -> list[int]:
        """The conversation's ids: the template's structure with its tokens, the content as text."""
        template = self._tok.chat_template
        sources = template.values() if isinstance(template, dict) else [template]
        if any(isinstance(s, str) and (_OPEN in s or _CLOSE in s) for s in sources):
            raise ConfigError("the chat template holds sandrl's private-use marker characters (U+10FFFA, U+10FFFB)")
        table: list[str] = []
        escaped = [self.escape(dict(m), table) for m in messages]
        escaped_tools = [self.escape(dict(t), table) for t in tools] if tools else None
        try:
            rendered = self._tok.apply_chat_template(
                escaped, tools=escaped_tools, add_generation_prompt=add_generation_prompt, tokenize=False
            )
        except Exception as exc:  # jinja's TemplateError and the template's own raise_exception
            raise ConfigError(f"the chat template cannot render this conversation: {exc}") from exc
        if not isinstance(rendered, str):
            raise ConfigError(f"the chat template rendered {type(rendered).__name__}, not text")
        if not table:  # apply_chat_template's own tokenization of its own rendering
            return [int(i) for i in self._tok(rendered, add_special_tokens=False)["input_ids"]]
        return self._encode_escaped(rendered, table)

    def _encode_escaped(self, rendered: str, table: list[str]) -> list[int]:
        if getattr(self._tok, "backend_tokenizer", None) is None:  # the offsets below need a fast tokenizer
            raise ConfigError(
                "message content holding the tokenizer's special-token text can only be encoded as text with a "
                "fast tokenizer (a checkpoint with tokenizer.json)"
            )
        encoded = self._tok(rendered, add_special_tokens=False, return_offsets_mapping=True)
        ids = [int(i) for i in encoded["input_ids"]]
        offsets = [(int(a), int(b)) for a, b in encoded["offset_mapping"]]
        out: list[int] = []
        run, text_at = 0, 0  # the first id and the first character after the last added token
        for index in [*(i for i, t in enumerate(ids) if t in self._added_ids), len(ids)]:
            stop = offsets[index][0] if index < len(ids) else len(rendered)
            stretch = rendered[text_at:stop]
            if _OPEN in stretch:
                text = _MARKER.sub(lambda m: table[int(m[1])] if int(m[1]) < len(table) else m[0], stretch)
                out += self._plain_ids(text, first=text_at == 0)
            else:
                out += ids[run:index]
            if index < len(ids):
                out.append(ids[index])
                text_at = offsets[index][1]
            run = index + 1
        return out

    def encode_text(self, text: str) -> list[int]:
        """``text`` as message content encodes: every character text, no added token matched."""
        return self._plain_ids(text, first=True)

    def _plain_ids(self, text: str, *, first: bool) -> list[int]:
        if not text:
            return []
        if getattr(self._tok, "backend_tokenizer", None) is None:  # a Python tokenizer: it can skip added tokens
            ids: list[int] = self._tok.encode(text, add_special_tokens=False, split_special_tokens=True)
        elif first or _SEAM in text:  # a text holding the seam is encoded as a first stretch (exact for byte-level BPE)
            ids = self._plain_encoder(seamed=False).encode(text, add_special_tokens=False).ids
        else:
            seamed = self._plain_encoder(seamed=True)
            ids = seamed.encode(_SEAM + text, add_special_tokens=False).ids
            if ids[:1] != [seamed.token_to_id(_SEAM)]:
                raise ConfigError("this tokenizer's pipeline moves text before an added token; cannot encode content")
            ids = ids[1:]
        forged = sorted(set(ids) & self._escaped_ids)
        if forged:
            raise ConfigError(
                f"this tokenizer writes {self._tok.convert_ids_to_tokens(forged)} from plain text (its vocabulary "
                "holds the added token itself), so message content cannot be kept apart from it"
            )
        return [int(i) for i in ids]

    def _plain_encoder(self, *, seamed: bool) -> Any:
        """The tokenizer's pipeline (normalizer, pre-tokenizer, model) without its added tokens, the seam
        its only one when ``seamed``; built once each."""
        if seamed not in self._plain:
            from tokenizers import AddedToken
            from tokenizers import Tokenizer as Backend

            spec = json.loads(self._tok.backend_tokenizer.to_str())
            spec["added_tokens"] = []
            plain = Backend.from_str(json.dumps(spec))
            if seamed:
                plain.add_special_tokens([AddedToken(_SEAM, special=True, normalized=False)])
            self._plain[seamed] = plain
        return self._plain[seamed]
