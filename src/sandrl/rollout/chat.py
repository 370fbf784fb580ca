"""The chat template, seen incrementally: the ids an agent appends turn by turn.

A multi-turn agent never re-renders the conversation. It renders the prompt once, appends the
model's output ids as they came, and then the ids of the next observation turn followed by the
next assistant prefix. :class:`ChatFormat` gives those pieces for sandrl's byte tokenizer
(which has ``encode_turn`` and ``assistant_prefix_ids``) and, by difference of two renderings,
for a Hugging Face tokenizer's chat template.
"""

from __future__ import annotations

from collections.abc import Sequence

from sandrl.errors import ConfigError
from sandrl.inference.tokenizer import ByteTokenizer, Tokenizer


class ChatFormat:
    """The pieces of a conversation's ids, for one tokenizer."""

    def __init__(self, tokenizer: Tokenizer, *, observation_role: str = "tool") -> None:
        self.tokenizer = tokenizer
        self.observation_role = observation_role
        self.stop_ids: frozenset[int] = frozenset(tokenizer.eos_token_ids)
        if not self.stop_ids:
            raise ConfigError("the tokenizer has no end-of-sequence token, so a model turn could never end")

    def prompt_ids(self, system: str, user: str) -> list[int]:
        """The opening: system prompt, the task, and the first assistant prefix."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return self.tokenizer.encode_messages(messages, add_generation_prompt=True)

    def close_ids(self) -> list[int]:
        """What ends an assistant turn the model left open (it hit its per-turn token limit)."""
        if isinstance(self.tokenizer, ByteTokenizer):
            return [self.tokenizer.im_end_id]
        return [self.tokenizer.eos_token_ids[0]]

    def observation_ids(self, text: str) -> list[int]:
        """After a closed assistant turn: the observation turn and the next assistant prefix."""
        tok = self.tokenizer
        if isinstance(tok, ByteTokenizer):
            return tok.encode_turn(self.observation_role, text) + tok.assistant_prefix_ids()
        return self._difference(text)

    def _difference(self, text: str) -> list[int]:
        # Render a stand-in conversation with and without the observation; what the template adds
        # after the assistant's stop token is the piece (Qwen's "\n" after <|im_end|> included).
        base = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"},
        ]
        before = self.tokenizer.encode_messages(base)
        after = self.tokenizer.encode_messages(
            [*base, {"role": self.observation_role, "content": text}], add_generation_prompt=True
        )
        if after[: len(before)] != before:
            raise ConfigError(
                "this chat template renders earlier turns differently once a turn follows them, so a "
                "conversation cannot be extended token-exactly; use a template without such rewrites"
            )
        stops = [i for i, t in enumerate(before) if t in self.stop_ids]
        if not stops:
            raise ConfigError("the chat template does not end an assistant turn with an end-of-sequence token")
        return after[stops[-1] + 1 :]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)
