"""The policy's tokens: the inference interfaces, clients for SGLang and OpenAI-compatible servers,
the byte tokenizer, the embedded CPU engine and the server that exposes it."""

from sandrl.inference.base import FinishReason, Generation, InferenceClient, SamplingParams

__all__ = ["FinishReason", "Generation", "InferenceClient", "SamplingParams"]
