"""Token log-probs and entropy without the logits of a whole micro-batch.

A causal LM's head turns every position's final hidden state into ``vocab`` logits: at 32k
tokens and Qwen's 152k vocabulary that is a 20 GB float32 tensor, kept for the backward pass.
The trainer needs one number per token (the log-prob of the token that followed) and, as a
metric, the entropy. :class:`PolicyForward` runs the model's decoder, then the head a chunk of
``chunk_tokens`` positions at a time; each chunk is recomputed in the backward pass
(``torch.utils.checkpoint``), so at most one chunk's logits exist at any moment, in either pass.

Logits are float32 whatever the model's dtype (bf16 hidden states and head weights are exact in
float32), so the ratios of the loss and the reference's log-probs lose nothing to bf16 rounding.

:class:`PolicyForward` is also the module the trainer shards (FSDP2's root): the head's weight is
only gathered inside a module's forward, so the chunked head must run inside one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class TokenLogprobs:
    """``[rows, width]`` tensors aligned with the input ids; column 0 (no context) is 0 in both."""

    logprobs: torch.Tensor
    """``log p(ids[t] | ids[:t])``, float32, differentiable."""
    entropy: torch.Tensor | None
    """The entropy of the predicted distribution at each position, when asked for (detached unless
    asked with its gradient, for an entropy bonus)."""


class PolicyForward(torch.nn.Module):
    """A Hugging Face causal LM (or a ``peft`` model around one) whose forward returns token log-probs."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.lm = model
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        # A plain tuple: registered as submodules they would appear twice in the state dict.
        self._parts: tuple[Any, Any, Any] = (inner.get_decoder(), inner.get_output_embeddings(), inner)
        config = inner.config
        self.logit_scale = float(getattr(config, "logit_scale", None) or 1.0)
        self.softcap = getattr(config, "final_logit_softcapping", None)

    @property
    def base(self) -> Any:
        """The Hugging Face model (inside the ``peft`` model with LoRA)."""
        return self._parts[2]

    @property
    def decoder(self) -> Any:
        return self._parts[0]

    @property
    def head(self) -> Any:
        return self._parts[1]

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        chunk_tokens: int = 1024,
        entropy: bool = False,
        entropy_grad: bool = False,
    ) -> TokenLogprobs:
        hidden = self.decoder(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        return self.token_logprobs(
            hidden, input_ids, chunk_tokens=chunk_tokens, entropy=entropy or entropy_grad, entropy_grad=entropy_grad
        )

    def token_logprobs(
        self,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        *,
        chunk_tokens: int,
        entropy: bool,
        entropy_grad: bool = False,
    ) -> TokenLogprobs:
        """The log-probs of ``input_ids[:, 1:]`` from the hidden states before them, a chunk at a time.

        ``entropy_grad``: the entropy keeps its gradient (an entropy bonus in the loss), at the cost of
        one more ``chunk x vocab`` buffer kept for the backward."""
        rows, width = input_ids.shape
        states = hidden[:, :-1].reshape(-1, hidden.shape[-1])
        targets = input_ids[:, 1:].reshape(-1)
        weight = self.head.weight if self.head.weight.dtype == torch.float32 else self.head.weight.float()
        bias = self.head.bias
        picked: list[torch.Tensor] = []
        spread: list[torch.Tensor] = []
        for start in range(0, targets.numel(), chunk_tokens):
            part = slice(start, start + chunk_tokens)
            args = (states[part], weight, bias, targets[part], entropy, entropy_grad)
            if torch.is_grad_enabled():
                lp, ent = checkpoint(self._chunk, *args, use_reentrant=False)
            else:
                lp, ent = self._chunk(*args)
            picked.append(lp)
            spread.append(ent)
        logprobs = torch.nn.functional.pad(_cat(picked).view(rows, width - 1), (1, 0))
        ent_table = torch.nn.functional.pad(_cat(spread).view(rows, width - 1), (1, 0)) if entropy else None
        return TokenLogprobs(logprobs=logprobs, entropy=ent_table)

    def _chunk(
        self,
        states: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        entropy: bool,
        entropy_grad: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = states.float() @ weight.t()
        if bias is not None:
            logits = logits + bias.float()
        if self.logit_scale != 1.0:
            logits = logits * self.logit_scale
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        norm = torch.logsumexp(logits, dim=-1)
        picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - norm
        if not entropy:
            return picked, picked.new_zeros(())
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            probs = torch.softmax(logits, dim=-1)
            ent = norm - (probs * logits).sum(-1)
        return picked, ent


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts) if len(parts) > 1 else parts[0]
