"""A client of vLLM's OpenAI server: token ids in and out, and weights reloaded without a restart.

Selected by ``--inference vllm://HOST:PORT`` (``[model] inference``). Sampling is the
:class:`~sandrl.inference.openai.OpenAIClient`'s completions mode: ``prompt`` as token ids,
``return_token_ids``, ``return_tokens_as_token_ids``, ``logprobs``, plus vLLM's
``return_weight_versions``, whose spans give each output token's weight version.

What vLLM offers for new weights, read in vLLM's source at v0.34.0 (commit 62d4bc3c7, the
PyPI sdist; ``vllm/entrypoints/rl/online/api_router.py``, ``serve/dev/rpc``, ``serve/dev/cache``,
``v1/worker/gpu_worker.py``, ``v1/core/sched/scheduler.py``). Every route below exists only
when the server runs with ``VLLM_SERVER_DEV_MODE=1``; without it vLLM has no restart-free way
to load a full checkpoint over HTTP (LoRA adapters aside), and this client says so.

- ``POST /pause?mode=abort|wait|keep`` and ``POST /resume``: ``abort`` ends requests in flight,
  ``wait`` lets them finish (then clears the KV and prefix caches), ``keep`` freezes them with
  their KV cache. In ``abort`` and ``wait`` modes new requests get 503 until ``/resume``.
- ``POST /collective_rpc`` ``{"method", "args", "kwargs", "timeout"}`` (string arguments only):
  ``reload_weights`` with ``weights_path`` reads a checkpoint directory into the live model
  in place (``Worker.reload_weights(weights_iterator, weights_path, is_checkpoint_format)``).
- ``POST /reset_prefix_cache?reset_running_requests=true``: preempts every running request
  (its KV cache dropped; it is recomputed from prompt + generated tokens when scheduled again)
  and empties the prefix cache. Without the flag it fails (``success: false``) while requests
  hold cache blocks.
- ``POST /update_weight_version`` ``{"new_version"}``: the label later tokens carry
  (``"default"`` until set). ``/init_weight_transfer_engine``, ``/start_weight_update``,
  ``/update_weights``, ``/finish_weight_update`` move tensors over NCCL or CUDA IPC (backends
  ``nccl``, ``ipc``...), not from disk; ``/sleep`` and ``/wake_up`` free and restore GPU memory.

The path this client takes for :meth:`VLLMClient.update_weights` (a checkpoint on the server's
disk, as the trainer exports it), by ``update_policy``:

- ``pause``: ``/pause?mode=wait`` (requests in flight finish on the old weights), reload,
  version, ``/resume``: SGLang's default, and vLLM's caches hold nothing of the old weights.
- ``in_place``: ``/pause?mode=keep``, reload, version, ``/resume``: frozen requests go on with
  the new weights over the KV cache the old ones built. vLLM cannot empty its prefix cache
  while they hold blocks, so a new request may reuse a cached prefix computed by the old weights.
- ``abort_and_resume``: ``/pause?mode=keep``, reload, ``/reset_prefix_cache?reset_running_requests=true``
  (SGLang's ``retract``: each request resumes as a continuation recomputed under the new
  weights), version, ``/resume``.

LoRA (``--enable-lora``, ``--max-lora-rank`` covering the adapters, and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``
in the server's environment, without which the routes do not exist): ``POST /v1/load_lora_adapter``
``{"lora_name", "lora_path"}`` and ``/v1/unload_lora_adapter`` ``{"lora_name"}`` answer 200 with a plain-text
``Success: ...`` line, or an OpenAI error (400: a name in use; 404: no such adapter). A request samples
with an adapter by naming it as its ``model`` (the client's :attr:`VLLMClient.lora_adapter`).

Requests this client sends while its own update runs wait for it (vLLM would answer them 503).
Log-probs: vLLM's default ``--logprobs-mode raw_logprobs`` is temperature 1, the trainer's scale
(``SamplingParams.scaled_logprobs=False``); a server started with ``processed_logprobs`` must be
declared (``logprobs_mode=``), else the client refuses a request whose scale it cannot know.
``logit_bias`` is refused: vLLM's raw log-probs are taken before the bias is added.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from sandrl.errors import ConfigError, InferenceError
from sandrl.inference.base import UPDATE_POLICIES, Generation, SamplingParams, UpdatePolicy
from sandrl.inference.kv_capacity import CapacityProbe, KVCapacity
from sandrl.inference.lora_client import AdapterVersions, is_adapter_dir, labelled
from sandrl.inference.openai import OpenAIClient
from sandrl.inference.tokenizer import Tokenizer
from sandrl.inference.transport import HTTPConfig, parse_version

SCHEME = "vllm://"
"""``[model] inference = "vllm://HOST:PORT"`` selects this client."""

LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]

_PAUSE_MODE: dict[str, str] = {"pause": "wait", "in_place": "keep", "abort_and_resume": "keep"}


def server_url(inference: str) -> str:
    """``vllm://HOST:PORT`` -> ``http://HOST:PORT`` (an http(s):// URL is kept as it is)."""
    if inference.startswith(("http://", "https://")):
        return inference.rstrip("/")
    if not inference.startswith(SCHEME):
        raise ConfigError(f"a vLLM server is named vllm://HOST:PORT or by its http(s):// URL, got {inference!r}")
    parts = urlsplit("http://" + inference.removeprefix(SCHEME))
    if not parts.hostname or parts.path.strip("/") or parts.query:
        raise ConfigError(f"{inference!r}: write vllm://HOST:PORT (e.g. vllm://127.0.0.1:8000), nothing after the port")
    return f"http://{parts.netloc}"


class VLLMClient(OpenAIClient):
    """An :class:`~sandrl.inference.base.InferenceClient` for ``vllm serve``; see the module docstring."""

    def __init__(
        self,
        url: str = "vllm://127.0.0.1:8000",
        model: str | None = None,
        *,
        update_policy: UpdatePolicy = "pause",
        logprobs_mode: LogprobsMode = "raw_logprobs",
        http: HTTPConfig | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        tokenizer: Tokenizer | None = None,
        max_context: int | None = None,
    ) -> None:
        if update_policy not in UPDATE_POLICIES:
            raise ConfigError(f"update_policy must be one of {', '.join(UPDATE_POLICIES)}, got {update_policy!r}")
        if logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise ConfigError(
                "logprobs_mode is the server's --logprobs-mode, raw_logprobs or processed_logprobs; "
                f"got {logprobs_mode!r}"
            )
        super().__init__(
            server_url(url) + "/v1",
            model,
            http=http,
            transport=transport,
            tokenizer=tokenizer,
            max_context=max_context,
        )
        self.update_policy = update_policy
        """What a weight update does to the server's requests in flight (see the module docstring)."""
        self.logprobs_mode = logprobs_mode
        self.last_update_s = 0.0
        """Wall time of the last :meth:`update_weights`, pause to resume."""
        self._open = asyncio.Event()
        self._open.set()
        self._updates = 0
        self.lora_adapter: str | None = None
        """The loaded LoRA adapter :meth:`generate` samples with (named as the request's ``model``); None: the base."""
        self._adapters = AdapterVersions()
        self._capacity = CapacityProbe()

    async def _request_model(self) -> str:
        return self.lora_adapter or await self.model()

    def _extra_body(self, params: SamplingParams) -> dict[str, Any]:
        return {"return_weight_versions": True}

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        self._check_params(params)
        await self._open.wait()  # this client's own update is under way
        sent, updates, adapter = self._version, self._updates, self.lora_adapter
        g = await super().generate(input_ids, params)
        if adapter is not None:
            return labelled(g, self._adapters.version_of(adapter))
        if g.output_weight_versions is not None:
            return g
        # A vLLM without weight-version spans: what the client itself knows. With no update of its
        # own meanwhile, or under `pause` (the update waited for this request), every token is `sent`'s.
        if self._updates == updates or self.update_policy == "pause":
            return replace(g, weight_version=sent, start_weight_version=sent)
        return replace(g, start_weight_version=sent)

    def _check_params(self, params: SamplingParams) -> None:
        if params.logit_bias:
            raise ConfigError(
                "logit_bias is not sent to vLLM: its log-probs are taken before the bias is added, so they would "
                "not be those of the distribution sampled from; drop logit_bias"
            )
        scaled = self.logprobs_mode == "processed_logprobs"
        if params.temperature not in (0.0, 1.0) and params.scaled_logprobs != scaled:
            wanted = "the sampling temperature" if params.scaled_logprobs else "temperature 1"
            raise ConfigError(
                f"log-probs at temperature {params.temperature} are wanted at {wanted}, but this vLLM server returns "
                f"{self.logprobs_mode} (a server-wide --logprobs-mode): start it with "
                f"--logprobs-mode {'processed_logprobs' if params.scaled_logprobs else 'raw_logprobs'} and say so "
                "(VLLMClient(logprobs_mode=...))"
            )

    async def update_weights(self, path: str, *, version: int | None = None) -> int:
        """Load the checkpoint directory ``path`` (on the server's disk) without restarting vLLM.

        The new version is ``version`` (the trainer's), else the current one plus one; the
        ``update_policy`` decides what happens to requests in flight (module docstring).

        A LoRA adapter directory (``adapter_config.json`` and no ``config.json``, as seen from here: the
        trainer's ``export = "adapter"``) is loaded as one instead (:meth:`update_lora_adapter`).
        """
        if is_adapter_dir(path):
            return await self.update_lora_adapter(path, version=version)
        new = version if version is not None else self._version + 1
        started = time.monotonic()
        async with self._closed_gate():
            await self._control("/pause?mode=" + _PAUSE_MODE[self.update_policy])
            try:
                await self._control("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}})
                if self.update_policy == "abort_and_resume":
                    answer = await self._control("/reset_prefix_cache?reset_running_requests=true")
                    if isinstance(answer, dict) and answer.get("success") is False:
                        raise InferenceError(
                            f"{self._root.base_url}/reset_prefix_cache could not retract the running requests; "
                            "use update_policy 'pause'"
                        )
                await self._set_version(new)
            finally:
                await self._control("/resume")
        self._version = new
        self._updates += 1
        self.last_update_s = time.monotonic() - started
        return new

    async def kv_capacity(self) -> KVCapacity | None:
        """The server's load and KV room (vLLM's ``/metrics`` gauges; a sandrl router's ``/v1/loads``:
        :mod:`~sandrl.inference.kv_capacity`); None: it reports none."""
        return await self._capacity.read(self._root.probe, self.base_url.removesuffix("/v1"))

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """Load the adapter directory ``path`` (on the server's disk) as ``name``: vLLM's ``/v1/load_lora_adapter``."""
        await self._lora_route("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    async def unload_lora_adapter(self, name: str) -> None:
        await self._lora_route("/v1/unload_lora_adapter", {"lora_name": name})

    async def update_lora_adapter(self, path: str, *, version: int | None = None) -> int:
        """Load the adapter at ``path`` as ``sandrl-v<version>`` and sample with it from now on (see
        :mod:`sandrl.inference.lora_client`); the version is ``version``, else the last one plus one."""
        new = version if version is not None else self._adapters.next_version(self._version)
        self.lora_adapter = await self._adapters.swap(self, path, new, self.lora_adapter)
        return new

    async def _lora_route(self, route: str, body: dict[str, Any]) -> None:
        try:
            await self._root.send("POST", route, body)  # 200 with a plain-text "Success: ..." line
        except ConfigError as exc:
            if exc.http_status == 404 and "/unload" not in route:
                raise ConfigError(
                    f"{self._root.base_url} has no {route}: vLLM serves it only when started with --enable-lora "
                    "(and a --max-lora-rank that covers the adapter) and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in "
                    'its environment; restart it so, or export merged weights instead ([train.lora] export = "merged")'
                ) from exc
            raise

    async def weight_version(self) -> int:
        """The server's weight version (vLLM's ``GET /weight_info``), or the last one this client set."""
        try:
            answer = await self._root.get("/weight_info")
        except ConfigError:  # no dev routes, or a vLLM before weight versions
            return self._version
        label = answer.get("weight_version") if isinstance(answer, dict) else None
        version = 0 if label == "default" else parse_version(label)
        if version is not None:
            self._version = version
        return self._version

    @contextlib.asynccontextmanager
    async def _closed_gate(self) -> AsyncIterator[None]:
        if not self._open.is_set():
            raise ConfigError("a weight update of this client is already under way; await it before the next")
        self._open.clear()
        try:
            yield
        finally:
            self._open.set()

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """vLLM's sleep mode (``/sleep``, level 1: weights to host memory, the KV cache dropped); vLLM puts
        both to sleep whatever ``tags`` names (it wakes them one by one)."""
        await self._control("/sleep?level=1")

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """vLLM's ``/wake_up`` (``tags``: ``weights``, ``kv_cache``; default both)."""
        query = "" if tags is None else "?" + "&".join(f"tags={t}" for t in tags if t != "cuda_graph")
        await self._control(f"/wake_up{query}")

    async def _set_version(self, new: int) -> None:
        try:
            await self._control("/update_weight_version", {"new_version": str(new)})
        except ConfigError as exc:
            if exc.http_status != 404:
                raise
            # A vLLM before weight versions: the client keeps the count; answers carry no spans.

    async def _control(self, route: str, body: dict[str, Any] | None = None) -> Any:
        """POST a dev-mode route; a 404 says how to start vLLM so that it has one."""
        try:
            response = await self._root.send("POST", route, body if body is not None else {})
        except ConfigError as exc:
            if exc.http_status == 404 and not route.startswith("/update_weight_version"):
                name = route.split("?")[0]
                raise ConfigError(
                    f"{self._root.base_url} has no {name}: vLLM serves its weight-reload routes (/pause, "
                    "/collective_rpc, /reset_prefix_cache, /resume) only when started with VLLM_SERVER_DEV_MODE=1; "
                    "restart it so, or restart vLLM on each new checkpoint instead (`vllm serve CHECKPOINT`)"
                ) from exc
            raise
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return None
