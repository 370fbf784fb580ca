"""A client of SGLang's native API: token ids in, token ids and their log-probs out.

``POST /generate`` with ``input_ids``, ``sampling_params`` and ``return_logprob``; the
answer's ``meta_info.output_token_logprobs`` is a list of ``[logprob, token_id, text]``,
one per output token, which gives the output ids and log-probs with no re-tokenizing.
``POST /update_weights_from_disk`` with ``model_path`` (and ``weight_version``, a string)
swaps the weights; ``GET /health`` says whether the server is up.

Works with a real SGLang server (``python -m sglang.launch_server``) and with sandrl's own
(``sandrl serve inference``), which serves the same routes.

A weight update follows the client's ``update_policy`` through SGLang's routes (plain update
for ``pause``; ``/pause_generation`` ``in_place`` or ``retract`` around it otherwise).
LoRA: ``POST /load_lora_adapter`` (``lora_name``, ``lora_path``) and ``/unload_lora_adapter`` (``lora_name``)
answer ``{success, error_message, loaded_adapters}``; ``/generate`` samples with the adapter named in its
``lora_path`` (the client's :attr:`SGLangClient.lora_adapter`). The server needs ``--enable-lora`` and a
``--max-lora-rank`` (and ``--lora-target-modules``) that cover the adapters.
Log-probs at a temperature other than 0 or 1 come on the scale ``SamplingParams.scaled_logprobs``
asks for: sandrl's server is told per request; a real SGLang cannot be, so the client must be
told how it was started (``original_logprobs``) or it refuses rather than mix scales.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any

import httpx

from sandrl.errors import ConfigError, InferenceError
from sandrl.inference.base import UPDATE_POLICIES, FinishReason, Generation, SamplingParams, UpdatePolicy
from sandrl.inference.kv_capacity import CapacityProbe, KVCapacity
from sandrl.inference.lora_client import AdapterVersions, is_adapter_dir, labelled
from sandrl.inference.tokenizer import Tokenizer
from sandrl.inference.transport import HTTPConfig, JSONTransport, parse_version


class SGLangClient:
    """An :class:`~sandrl.inference.base.InferenceClient` for a server with SGLang's native routes."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:30000",
        *,
        http: HTTPConfig | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        tokenizer: Tokenizer | None = None,
        max_context: int | None = None,
        update_policy: UpdatePolicy = "pause",
        original_logprobs: bool | None = None,
    ) -> None:
        if update_policy not in UPDATE_POLICIES:
            raise ConfigError(f"update_policy must be one of {', '.join(UPDATE_POLICIES)}, got {update_policy!r}")
        self.update_policy = update_policy
        """What a weight update does to the server's requests in flight (see :meth:`update_weights`)."""
        self.original_logprobs = original_logprobs
        """Whether the server returns temperature-1 log-probs (an SGLang started with
        ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``). None: unknown; sandrl's server is asked per request."""
        self._sandrl: bool | None = None
        self._http = JSONTransport(base_url, http, transport=transport)
        self.base_url = self._http.base_url
        self.tokenizer = tokenizer
        """The served checkpoint's tokenizer, when the caller has it (the server works in ids only)."""
        self.max_context = max_context
        """The served model's context length, when the caller knows it."""
        # SGLang's version is "default" until someone sets one; count from 0 locally until then.
        self._version = 0
        self.lora_adapter: str | None = None
        """The loaded LoRA adapter :meth:`generate` samples with (SGLang's ``lora_path``); None: the base model."""
        self._adapters = AdapterVersions()
        self._capacity = CapacityProbe()

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        body: dict[str, Any] = {
            "input_ids": list(input_ids),
            "sampling_params": sampling_params(params),
            "return_logprob": True,
            # Only the output's log-probs: scoring the prompt would be wasted work.
            "logprob_start_len": -1,
            "stream": False,
        }
        if params.top_logprobs:
            body["top_logprobs_num"] = params.top_logprobs
        adapter = self.lora_adapter
        if adapter is not None:
            body["lora_path"] = adapter
        body.update(await self._logprob_scale(params))
        answer = await self._http.post("/generate", body)
        if isinstance(answer, list):
            answer = answer[0] if answer else None
        if not isinstance(answer, dict):
            raise self._bad_answer("/generate", answer)
        return labelled(self._generation(answer, len(input_ids)), self._adapters.version_of(adapter))

    async def _logprob_scale(self, params: SamplingParams) -> dict[str, Any]:
        """Fields that get log-probs on the scale ``params`` asks for, or a ConfigError when none can.

        At temperature 0 or 1 both scales agree. Otherwise SGLang returns them at the sampling
        temperature unless it was started with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``, a switch no
        request can flip: sandrl's server takes ``return_original_logprob`` per request instead.
        """
        if params.temperature in (0.0, 1.0):
            return {}
        if self._sandrl is None:
            try:
                info = await self._http.get("/get_server_info")
            except ConfigError:
                info = {}
            self._sandrl = isinstance(info, dict) and info.get("engine") == "sandrl"
        if self._sandrl:
            return {"return_original_logprob": not params.scaled_logprobs}
        if self.original_logprobs is None or self.original_logprobs == params.scaled_logprobs:
            server = {None: "unknown", True: "temperature 1", False: "the sampling temperature"}[self.original_logprobs]
            wanted = "the sampling temperature" if params.scaled_logprobs else "temperature 1"
            raise ConfigError(
                f"{self.base_url}: log-probs at temperature {params.temperature} are wanted at {wanted}, and the "
                f"server's scale is {server}. SGLang returns them at the sampling temperature unless started with "
                "SGLANG_RETURN_ORIGINAL_LOGPROB=1: start it to match and say so (SGLangClient(original_logprobs=...))"
            )
        return {}

    async def update_weights(self, path: str, *, version: int | None = None) -> int:
        """Load the weights at ``path``; the new version is ``version`` (the trainer's), else the server's + 1.

        The client's ``update_policy`` says what happens to requests in flight, through SGLang's own
        routes: ``pause`` is SGLang's plain update (it waits for them); ``in_place`` and
        ``abort_and_resume`` pause generation in SGLang's ``in_place`` / ``retract`` mode around it.

        A LoRA adapter directory (``adapter_config.json`` and no ``config.json``, as seen from here: the
        trainer's ``export = "adapter"``) is loaded as one instead (:meth:`update_lora_adapter`).
        """
        if is_adapter_dir(path):
            return await self.update_lora_adapter(path, version=version)
        new = version if version is not None else await self.weight_version() + 1
        mode = {"in_place": "in_place", "abort_and_resume": "retract"}.get(self.update_policy)
        if mode is not None:
            await self._http.post("/pause_generation", {"mode": mode})
        try:
            answer = await self._http.post(
                "/update_weights_from_disk",
                {"model_path": path, "weight_version": str(new), "abort_all_requests": False},
            )
        finally:
            if mode is not None:
                await self._http.post("/continue_generation", {})
        if not isinstance(answer, dict) or not answer.get("success", False):
            message = answer.get("message") if isinstance(answer, dict) else answer
            raise InferenceError(f"{self.base_url} could not load the weights in {path}: {message}")
        self._version = parse_version(answer.get("weight_version")) or new
        return self._version

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """Load the adapter directory ``path`` (on the server's disk) as ``name``: SGLang's ``/load_lora_adapter``."""
        await self._lora_route("/load_lora_adapter", {"lora_name": name, "lora_path": path})

    async def unload_lora_adapter(self, name: str) -> None:
        await self._lora_route("/unload_lora_adapter", {"lora_name": name})

    async def update_lora_adapter(self, path: str, *, version: int | None = None) -> int:
        """Load the adapter at ``path`` as ``sandrl-v<version>`` and sample with it from now on (see
        :mod:`sandrl.inference.lora_client`); the version is ``version``, else the last one plus one."""
        new = version if version is not None else self._adapters.next_version(await self.weight_version())
        self.lora_adapter = await self._adapters.swap(self, path, new, self.lora_adapter)
        return new

    async def _lora_route(self, route: str, body: dict[str, Any]) -> None:
        try:
            answer = await self._http.post(route, body)
        except ConfigError as exc:
            if exc.http_status == 404:
                raise ConfigError(
                    f"{self.base_url} has no {route}: start SGLang with --enable-lora (and a --max-lora-rank and "
                    "--lora-target-modules that cover the adapter), or export merged weights instead "
                    '([train.lora] export = "merged")'
                ) from exc
            raise
        if not isinstance(answer, dict) or not answer.get("success", False):
            message = answer.get("error_message") if isinstance(answer, dict) else answer
            raise InferenceError(f"{self.base_url}{route} failed: {message}")

    async def weight_version(self) -> int:
        """The server's weight version (SGLang's ``/get_weight_version``), or the last one this client set."""
        try:
            answer = await self._http.get("/get_weight_version")
        except ConfigError:  # an older SGLang without the route answers 404: keep the local count
            return self._version
        version = parse_version(answer.get("weight_version")) if isinstance(answer, dict) else None
        if version is not None:
            self._version = version
        return self._version

    async def health(self) -> None:
        await self._http.send("GET", "/health")

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """Hand the server's GPU memory (``weights``, ``kv_cache``; default all) to a colocated trainer."""
        await self._http.post("/release_memory_occupation", {} if tags is None else {"tags": list(tags)})

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        await self._http.post("/resume_memory_occupation", {} if tags is None else {"tags": list(tags)})

    async def kv_capacity(self) -> KVCapacity | None:
        """The server's load and KV room (SGLang's ``/v1/loads``: :mod:`~sandrl.inference.kv_capacity`); None: it
        reports none (an SGLang without the route)."""
        return await self._capacity.read(self._http.probe, self.base_url)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> SGLangClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _generation(self, answer: dict[str, Any], prompt_len: int) -> Generation:
        meta = answer.get("meta_info")
        if not isinstance(meta, dict) or not isinstance(meta.get("output_token_logprobs"), list):
            raise self._bad_answer("/generate", answer)
        entries = meta["output_token_logprobs"]
        ids = [int(e[1]) for e in entries]
        logprobs = [float(e[0]) for e in entries]
        finish = meta.get("finish_reason") or {}
        kind = finish.get("type") if isinstance(finish, dict) else finish
        reason: FinishReason = kind if kind in ("stop", "length") else "abort"
        version = parse_version(meta.get("weight_version"))
        if version is not None:
            self._version = version
        top = meta.get("output_top_logprobs")
        # sandrl's own server says which weights produced each token; SGLang does not.
        per_token = meta.get("output_token_weight_versions")
        return Generation(
            output_ids=ids,
            output_logprobs=logprobs,
            finish_reason=reason,
            weight_version=self._version if version is None else version,
            prompt_tokens=int(meta.get("prompt_tokens", prompt_len)),
            start_weight_version=parse_version(meta.get("start_weight_version")),
            matched_stop=finish.get("matched") if isinstance(finish, dict) else None,
            text=answer.get("text") if isinstance(answer.get("text"), str) else None,
            output_top_logprobs=[[(int(e[1]), float(e[0])) for e in row] for row in top] if top else None,
            output_weight_versions=[int(v) for v in per_token] if isinstance(per_token, list) else None,
            cached_tokens=cached if isinstance(cached := meta.get("cached_tokens"), int) and cached > 0 else 0,
        )

    def _bad_answer(self, path: str, answer: Any) -> InferenceError:
        return InferenceError(
            f"{self.base_url}{path} answered without meta_info.output_token_logprobs ({str(answer)[:200]}); "
            "is that an SGLang server?",
            error_code="inference_bad_response",
        )


def sampling_params(params: SamplingParams) -> dict[str, Any]:
    """SGLang's ``sampling_params`` for ``params``: stop tokens and strings kept in the output."""
    out: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "ignore_eos": params.ignore_eos,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if params.stop:
        out["stop"] = list(params.stop)
    if params.stop_token_ids:
        out["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None:
        out["sampling_seed"] = params.seed
    return out
