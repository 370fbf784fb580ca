"""The policy's tokens: the inference interfaces, clients for SGLang and OpenAI-compatible servers,
the byte tokenizer, the embedded CPU engine and the server that exposes it, and the tool-call
parsers that read each model family's replies (:mod:`sandrl.inference.toolcalls`)."""

from sandrl.inference.base import FinishReason, Generation, InferenceClient, SamplingParams

__all__ = ["FinishReason", "Generation", "InferenceClient", "SamplingParams"]
