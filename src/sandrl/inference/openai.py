"""A client of OpenAI-compatible servers (vLLM, SGLang, sandrl) that stays token-exact.

Two modes:

- ``completions`` (default): ``POST /v1/completions`` with the token ids themselves as the
  ``prompt``, which vLLM, SGLang and sandrl accept. The output ids come from vLLM's
  ``return_token_ids`` (``choices[i].token_ids``) or, failing that, from its
  ``return_tokens_as_token_ids``, which spells each logprobs token as ``token_id:N``.
- ``chat``: ``POST /v1/chat/completions`` for servers that only take messages. The prompt
  ids are parsed back into messages with the chat template (the byte tokenizer's
  :meth:`~sandrl.inference.tokenizer.ByteTokenizer.parse_messages`), so they must be a
  rendering of that template ending in the assistant prefix; the output ids come back the
  same two ways as above.

Log-probs are the ``logprobs`` of each sampled token. Per-token weight versions come from
vLLM's ``weight_versions`` spans when a server sends them (:mod:`~sandrl.inference.version_spans`).
Weight updates use the SGLang-style ``/update_weights_from_disk`` at the server's root (SGLang
and sandrl have it); vLLM has its own routes, which :class:`~sandrl.inference.vllm.VLLMClient` uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any, Literal, Protocol

import httpx

from sandrl.errors import ConfigError, InferenceError
from sandrl.inference.base import FinishReason, Generation, SamplingParams
from sandrl.inference.tokenizer import Tokenizer
from sandrl.inference.transport import HTTPConfig, JSONTransport, parse_version
from sandrl.inference.version_spans import from_spans

_TOKEN_PREFIX = "token_id:"


class ChatParser(Protocol):
    """Turns prompt ids back into chat messages (what the chat mode needs from a tokenizer)."""

    def parse_messages(self, ids: Sequence[int]) -> tuple[list[dict[str, str]], bool]: ...


class OpenAIClient:
    """An :class:`~sandrl.inference.base.InferenceClient` over the OpenAI API's completions or chat routes."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000/v1",
        model: str | None = None,
        *,
        mode: Literal["completions", "chat"] = "completions",
        chat_parser: ChatParser | None = None,
        http: HTTPConfig | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        tokenizer: Tokenizer | None = None,
        max_context: int | None = None,
    ) -> None:
        if mode not in ("completions", "chat"):
            raise ConfigError(f"OpenAIClient mode must be 'completions' or 'chat', got {mode!r}")
        if mode == "chat" and chat_parser is None:
            raise ConfigError(
                "OpenAIClient(mode='chat') needs a chat_parser (e.g. ByteTokenizer()) to turn prompt ids into messages"
            )
        base = base_url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        self.mode = mode
        self._model = model
        self._parser = chat_parser
        self._http = JSONTransport(self.base_url, http, transport=transport)
        # Weight updates live at the server's root, beside /v1.
        self._root = JSONTransport(self.base_url.removesuffix("/v1"), http, transport=transport)
        self._version = 0
        self.tokenizer = tokenizer
        """The served checkpoint's tokenizer, when the caller has it (prompts are sent as ids)."""
        self.max_context = max_context
        """The served model's context length, when the caller knows it."""

    async def model(self) -> str:
        """The served model's name: the one given, else the first of ``GET /v1/models``."""
        if self._model is None:
            answer = await self._http.get("/models")
            data = answer.get("data") if isinstance(answer, dict) else None
            if not data or not isinstance(data[0], dict) or "id" not in data[0]:
                raise InferenceError(
                    f"{self.base_url}/models lists no model ({str(answer)[:200]}); pass model= explicitly",
                    error_code="inference_bad_response",
                )
            self._model = str(data[0]["id"])
        return self._model

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        body: dict[str, Any] = {
            "model": await self._request_model(),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "n": 1,
            "stream": False,
            # vLLM / SGLang / sandrl extensions that keep the answer token-exact.
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            "ignore_eos": params.ignore_eos,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            body["seed"] = params.seed
        if params.logit_bias:
            body["logit_bias"] = {str(token): bias for token, bias in params.logit_bias}
        body.update(self._extra_body(params))
        if self.mode == "completions":
            body.update(prompt=list(input_ids), max_tokens=params.max_new_tokens, logprobs=max(1, params.top_logprobs))
            answer = await self._http.post("/completions", body)
        else:
            assert self._parser is not None
            messages, open_turn = self._parser.parse_messages(input_ids)
            if not open_turn:
                raise ConfigError(
                    "chat mode needs prompt ids that end with the assistant prefix (encode_messages(..., "
                    "add_generation_prompt=True)): the server adds it itself"
                )
            body.update(messages=messages, max_tokens=params.max_new_tokens, logprobs=True)
            body["top_logprobs"] = params.top_logprobs
            answer = await self._http.post("/chat/completions", body)
        return self._generation(answer, len(input_ids), params.top_logprobs)

    async def _request_model(self) -> str:
        """What a request names as its ``model`` (a subclass may name a LoRA adapter instead)."""
        return await self.model()

    def _extra_body(self, params: SamplingParams) -> dict[str, Any]:
        """Fields a server-specific subclass adds to every request (none here)."""
        return {}

    async def update_weights(self, path: str, *, version: int | None = None) -> int:
        """Load the weights at ``path`` (SGLang's and sandrl's root route); the new version is ``version``, else + 1."""
        new = version if version is not None else self._version + 1
        try:
            answer = await self._root.post(
                "/update_weights_from_disk", {"model_path": path, "weight_version": str(new)}
            )
        except ConfigError as exc:
            if exc.http_status == 404:
                raise ConfigError(
                    f"{self._root.base_url} has no /update_weights_from_disk (a vLLM server?): "
                    "serve the policy with SGLang or `sandrl serve inference`, or restart the server on the new weights"
                ) from exc
            raise
        if not isinstance(answer, dict) or not answer.get("success", False):
            message = answer.get("message") if isinstance(answer, dict) else answer
            raise InferenceError(f"{self._root.base_url} could not load the weights in {path}: {message}")
        self._version = parse_version(answer.get("weight_version")) or new
        return self._version

    async def health(self) -> None:
        await self._http.send("GET", "/models")

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._root.aclose()

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- reading the answer -----------------------------------------------------------------------

    def _generation(self, answer: Any, prompt_len: int, top_k: int) -> Generation:
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not choices or not isinstance(choices[0], dict):
            raise self._bad(f"no choices in the answer ({str(answer)[:200]})")
        choice = choices[0]
        logprobs = choice.get("logprobs") or {}
        if self.mode == "completions":
            tokens = list(logprobs.get("tokens") or [])
            values = list(logprobs.get("token_logprobs") or [])
            tops = [_top_from_dict(d) for d in logprobs.get("top_logprobs") or []]
            text = choice.get("text")
        else:
            content = list(logprobs.get("content") or [])
            tokens = [c.get("token") for c in content]
            values = [c.get("logprob") for c in content]
            tops = [
                [(_token_id(t.get("token")), float(t["logprob"])) for t in c.get("top_logprobs") or []] for c in content
            ]
            text = (choice.get("message") or {}).get("content")
        ids = choice.get("token_ids")
        if ids is None:
            if any(not (isinstance(t, str) and t.startswith(_TOKEN_PREFIX)) for t in tokens):
                raise self._bad(
                    "the answer has neither token_ids nor logprobs tokens of the form 'token_id:N', so the output "
                    "cannot be known token-exactly; the server must support vLLM's return_token_ids or "
                    "return_tokens_as_token_ids"
                )
            ids = [_token_id(t) for t in tokens]
        if len(values) != len(ids) or any(v is None for v in values):
            raise self._bad(f"the answer has {len(ids)} output tokens but {len(values)} log-probs; ask for logprobs")
        version = parse_version(answer.get("weight_version"))
        per_token = from_spans(choice.get("weight_versions"), len(ids))  # vLLM's spans, when asked for
        if per_token:
            version = per_token[-1]
        if version is not None:
            self._version = version
        usage = answer.get("usage") or {}
        reason = choice.get("finish_reason")
        finish: FinishReason = reason if reason in ("stop", "length") else "abort"
        stop_reason = choice.get("stop_reason")
        return Generation(
            output_ids=[int(i) for i in ids],
            output_logprobs=[float(v) for v in values],
            finish_reason=finish,
            weight_version=per_token[-1] if per_token else self._version,
            prompt_tokens=int(usage.get("prompt_tokens", prompt_len)),
            start_weight_version=per_token[0] if per_token else None,
            matched_stop=stop_reason if isinstance(stop_reason, int | str) else None,
            text=text if isinstance(text, str) else None,
            output_top_logprobs=[t[:top_k] for t in tops] if top_k else None,
            output_weight_versions=per_token,
            cached_tokens=_cached_tokens(usage),
        )

    def _bad(self, what: str) -> InferenceError:
        return InferenceError(f"{self.base_url}: {what}", error_code="inference_bad_response")


def _cached_tokens(usage: dict[str, Any]) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` (OpenAI's; SGLang's with ``--enable-cache-report``), else 0."""
    details = usage.get("prompt_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) and value > 0 else 0


def _token_id(token: Any) -> int:
    if not isinstance(token, str) or not token.startswith(_TOKEN_PREFIX):
        raise InferenceError(
            f"expected a logprobs token of the form 'token_id:N', got {token!r}: the server ignored "
            "return_tokens_as_token_ids",
            error_code="inference_bad_response",
        )
    return int(token.removeprefix(_TOKEN_PREFIX))


def _top_from_dict(entry: Any) -> list[tuple[int, float]]:
    if not isinstance(entry, dict):
        return []
    pairs = [(_token_id(token), float(value)) for token, value in entry.items()]
    return sorted(pairs, key=lambda pair: -pair[1])
