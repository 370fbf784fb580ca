"""The trainer's side of broadcast weight updates: rank 0 of a weight-update group with every engine.

:class:`WeightBroadcast` speaks SGLang's protocol to each engine (sandrl's embedded server serves it
too, over gloo): at :meth:`~WeightBroadcast.connect` it picks a port, asks each engine to join at its
rank offset (one rank per tensor-parallel worker of the engines before it, after rank 0) and joins as
rank 0 itself; each :meth:`~WeightBroadcast.push` sends the
weights in buckets of about ``bucket_bytes``: for each bucket it posts the names, dtypes and shapes to
every engine and broadcasts the tensors at once. Only one bucket's tensors are held at a time, so a
sharded trainer gathers its full tensors bucket by bucket, never the whole model.

The group's backend: NCCL between GPUs (SGLang engines), gloo on CPU, and for sandrl's embedded
engines on the trainer's host (every URL loopback) shared memory (:mod:`~sandrl.inference.weight_shm`:
each bucket written once, copied out by every engine, where gloo sends it over loopback TCP once per
engine); an engine that cannot open the segment (another ``/dev/shm``) makes the group fall back to gloo.

What an update does to requests in flight: the embedded engine stages the buckets and swaps the
weights in whole under the ``update_policy`` sent with each bucket; an SGLang engine applies each
bucket as it comes, so generation is paused around the push (``in_place`` / ``retract`` modes for
those policies; ``pause``: SGLang's update waits for the requests in flight, per bucket).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import threading
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import torch

from sandrl.errors import ConfigError, InferenceError, SandrlError
from sandrl.http_auth import is_loopback
from sandrl.inference.base import UPDATE_POLICIES, UpdatePolicy
from sandrl.inference.transport import HTTPConfig, JSONTransport
from sandrl.inference.weight_group import GroupAddress, GroupMember, dtype_name, join_group
from sandrl.inference.weight_shm import shm_room

DEFAULT_BUCKET_BYTES = 256 * 2**20


@dataclass(frozen=True)
class BroadcastSpec:
    """What a :class:`WeightBroadcast` is made of, picklable: the driver hands it to the trainer's rank 0."""

    urls: tuple[str, ...]
    api_key: str | None = None
    master_address: str = "127.0.0.1"
    """Where the group meets (rank 0 listens there); empty: rank 0's own address on the route to the engines,
    found where rank 0 runs (a trainer actor of a Ray cluster may run on another host than the driver)."""
    backend: str = "gloo"
    """``gloo``, ``nccl`` or ``shm``; empty: chosen where rank 0 runs: NCCL when it has a GPU and the engines are
    SGLang's, shared memory for sandrl's engines on rank 0's host (every URL loopback), else gloo."""
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    update_policy: UpdatePolicy = "pause"
    sglang: bool = False
    timeout_s: float = 60.0
    """How long the group waits for every rank to join, and each collective for the others."""
    epoch: int = 0
    """The engines' losses so far (:class:`~sandrl.inference.broadcast_policy.BroadcastTargets`): a spec
    that differs in it, or in ``urls``, needs a new group."""

    def __post_init__(self) -> None:
        if self.bucket_bytes < 1:
            raise ConfigError(f"bucket_bytes must be positive, got {self.bucket_bytes}")
        if self.update_policy not in UPDATE_POLICIES:
            raise ConfigError(f"update_policy must be one of {', '.join(UPDATE_POLICIES)}, got {self.update_policy!r}")


def model_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """A live model's weights by name, each tensor once: a tied weight (the output layer that is the
    embedding) is sent under its first name only, and the engine's copy, tied too, takes it."""
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    state: dict[str, torch.Tensor] = model.state_dict()
    for name, tensor in state.items():
        # Every tensor of a live model's state stays alive, so equal addresses mean one tensor.
        same = (tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()), tuple(tensor.shape))
        if same not in seen:
            seen.add(same)
            yield name, tensor


def buckets(tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """``tensors`` in order, in buckets of at most ``bucket_bytes`` (a bigger tensor is a bucket of its own)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor.detach().contiguous()))
        size += nbytes
    if bucket:
        yield bucket


class WeightBroadcast:
    """Push weights to the engines of ``spec`` over a process group; see the module docstring."""

    def __init__(self, spec: BroadcastSpec) -> None:
        if not spec.urls:
            raise ConfigError("a weight broadcast needs at least one engine URL")
        self._chose_backend = not spec.backend
        if not spec.master_address or not spec.backend:
            master_address = spec.master_address or address_towards(spec.urls[0])
            spec = dataclasses.replace(
                spec, master_address=master_address, backend=spec.backend or _backend_for(spec, master_address)
            )
        self.spec = spec
        self.engines = [JSONTransport(url, HTTPConfig(api_key=spec.api_key, retries=0)) for url in spec.urls]
        self.group: GroupMember | None = None
        self.group_name = f"sandrl-{uuid.uuid4().hex[:12]}"
        self.bytes_pushed = 0

    @property
    def urls(self) -> list[str]:
        return list(self.spec.urls)

    async def connect(self) -> None:
        """Form the group: every engine joins as its ranks, this process as rank 0 (idempotent)."""
        if self.group is not None:
            return
        offsets, world_size = await self._ranks()
        address = GroupAddress(
            self.spec.master_address,
            _free_port(self.spec.master_address),
            world_size,
            self.group_name,
            self.spec.backend,
        )
        own = asyncio.create_task(asyncio.to_thread(join_group, address, 0, timeout_s=self.spec.timeout_s))
        if address.backend == "shm":
            await asyncio.wait({own})  # the segment exists before an engine opens it
        joins = [
            asyncio.create_task(
                engine.post(
                    "/init_weights_update_group",
                    {
                        "master_address": address.master_address,
                        "master_port": address.master_port,
                        "rank_offset": offset,
                        "world_size": address.world_size,
                        "group_name": address.group_name,
                        "backend": address.backend,
                    },
                )
            )
            for engine, offset in zip(self.engines, offsets, strict=True)
        ]
        # An engine that refuses (a wrong token, no gloo) ends the wait at once; this side's join, blocked in
        # its thread until every rank arrives, is then left to time out, and closed if it ever completes.
        pending: set[asyncio.Task[Any]] = {own, *joins}
        failure: tuple[str, object] | None = None
        while pending and failure is None:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                where = "trainer" if task is own else self.urls[joins.index(task)]
                error = task.exception()
                if error is not None or _refused(task.result()):
                    failure = (where, error if error is not None else task.result())
        if failure is not None:
            own.add_done_callback(lambda t: t.result().close() if not t.exception() else None)
            for task in joins:
                task.cancel()
            await self._forget_group()  # engines that joined leave it: the next group has another name
            where, why = failure
            if self._chose_backend and address.backend == "shm" and _code(why) == "shm_unavailable":
                self.spec = dataclasses.replace(self.spec, backend="gloo")
                return await self.connect()
            raise InferenceError(
                f"could not form the weight-update group with {where}: {_why(why)}; "
                "engines must reach this host's "
                f'{address.master_address}:{address.master_port} (or set [inference] weight_sync = "disk")'
            )
        self.group = own.result()
        self.group.all_joined()

    async def _ranks(self) -> tuple[list[int], int]:
        """Each engine's first rank in the group, and the group's size: an SGLang engine of several GPUs joins with
        one rank per tensor-parallel worker (its ``tp_size``; sandrl's engine and a server that says none: one)."""

        async def tp_size(engine: JSONTransport) -> int:
            try:
                info = await engine.get("/get_server_info") if self.spec.sglang else {}
            except InferenceError:
                info = {}
            size = info.get("tp_size", 1) if isinstance(info, dict) else 1
            return size if isinstance(size, int) and not isinstance(size, bool) and 0 < size <= 4096 else 1

        sizes = await asyncio.gather(*(tp_size(engine) for engine in self.engines))
        offsets = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        return offsets, 1 + sum(sizes)

    async def push(self, tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> int:
        """Send every tensor of ``tensors`` (all the model's weights) as version ``version``; return it."""
        await self.connect()
        assert self.group is not None
        modes = {"in_place": "in_place", "abort_and_resume": "retract"}
        mode = modes.get(self.spec.update_policy) if self.spec.sglang else None
        if mode is not None:
            await asyncio.gather(*(e.post("/pause_generation", {"mode": mode}) for e in self.engines))
        try:
            answers: list[Any] = []
            # A bucket is taken in a worker thread: taking it may gather shards (a collective of the trainer's).
            pending = buckets(tensors, self.spec.bucket_bytes)
            while (bucket := await asyncio.to_thread(next, pending, None)) is not None:
                answers = await self._send(bucket, version)
        except BaseException:
            await self.aclose()  # the group may be out of step: the next push forms a new one
            raise
        finally:
            if mode is not None:
                await asyncio.gather(*(e.post("/continue_generation", {}) for e in self.engines))
        for url, answer in zip(self.urls, answers, strict=True):
            if not self.spec.sglang and answer.get("staged", False):
                raise InferenceError(
                    f"{url} has not swapped the new weights in: the push covered only part of its model's "
                    f"weights ({answer.get('message')})"
                )
        return version

    async def _send(self, bucket: list[tuple[str, torch.Tensor]], version: int) -> list[Any]:
        assert self.group is not None
        body: dict[str, Any] = {
            "names": [name for name, _ in bucket],
            "dtypes": [dtype_name(t.dtype) for _, t in bucket],
            "shapes": [list(t.shape) for _, t in bucket],
            "group_name": self.group_name,
            "weight_version": str(version),
            "flush_cache": True,
        }
        if not self.spec.sglang:
            body["update_policy"] = self.spec.update_policy
        device = self.group.device
        tensors = [t.to(device or "cpu") for _, t in bucket]  # gloo and shared memory send from host memory
        sent = asyncio.create_task(asyncio.to_thread(self.group.broadcast, tensors))
        if self.group.writes_first:
            await asyncio.wait({sent})
        posts = [asyncio.create_task(engine.post("/update_weights_from_distributed", body)) for engine in self.engines]
        done = await asyncio.gather(sent, *posts, return_exceptions=True)
        # An engine's refusal says why; the broadcast's own failure follows from it (the engine left the group).
        for url, answer in zip([*self.urls, "trainer"], [*done[1:], done[0]], strict=True):
            if isinstance(answer, BaseException) or _refused(answer):
                raise InferenceError(f"the weight push to {url} failed: {_why(answer)}")
        self.bytes_pushed += sum(t.numel() * t.element_size() for _, t in bucket)
        return list(done[1:])

    async def aclose(self) -> None:
        """Leave the group (the engines too); the next push forms a new one."""
        group, self.group = self.group, None
        if group is None:
            return
        await self._forget_group()
        group.close()

    async def _forget_group(self) -> None:
        """Ask every engine to leave the group (those not in it refuse: ignored); the next one gets a new name."""
        with contextlib.suppress(Exception):
            await asyncio.gather(
                *(e.post("/destroy_weights_update_group", {"group_name": self.group_name}) for e in self.engines),
                return_exceptions=True,
            )
        self.group_name = f"sandrl-{uuid.uuid4().hex[:12]}"

    async def shutdown(self) -> None:
        await self.aclose()
        for engine in self.engines:
            await engine.aclose()


def address_towards(url: str) -> str:
    """This host's address on the route to ``url``'s host (a UDP socket's connect sends nothing)."""
    parts = urlsplit(url)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((parts.hostname or "127.0.0.1", parts.port or 80))
        return str(sock.getsockname()[0])


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _backend_for(spec: BroadcastSpec, master_address: str) -> str:
    if spec.sglang:
        return "nccl" if torch.cuda.is_available() else "gloo"
    on_this_host = is_loopback(master_address) and all(is_loopback(urlsplit(u).hostname or "") for u in spec.urls)
    return "shm" if on_this_host and shm_room() >= spec.bucket_bytes else "gloo"


def _code(answer: object) -> object:
    if isinstance(answer, SandrlError):
        return answer.error_code
    return answer.get("error_code") if isinstance(answer, dict) else None


def _refused(answer: object) -> bool:
    return isinstance(answer, dict) and answer.get("success") is False


def _why(answer: object) -> str:
    if isinstance(answer, dict):
        return str(answer.get("message", answer))
    return str(answer)


def broadcast_for(current: BlockingBroadcast | None, spec: BroadcastSpec) -> BlockingBroadcast:
    """What pushes to ``spec``'s engines: ``current`` while its spec is the same (its group is kept between
    pushes), else a new one, ``current`` closed (the fleet's engines changed: a new group is formed)."""
    if current is not None and current.spec == spec:
        return current
    if current is not None:
        current.close()
    return BlockingBroadcast(spec)


class BlockingBroadcast:
    """A :class:`WeightBroadcast` for code that is not async (a training rank): its own event loop, kept
    between pushes (the group and the connections live on it)."""

    def __init__(self, spec: BroadcastSpec) -> None:
        self.spec = spec
        self._loop = asyncio.new_event_loop()
        self._push = WeightBroadcast(spec)

    def push(self, tensors: Iterator[tuple[str, torch.Tensor]], version: int) -> str | None:
        """Push every tensor of ``tensors``; None when the engines serve ``version`` now, else why not. The
        iterator is always run to its end: on a sharded trainer each step of it is a collective of every rank."""
        try:
            self._loop.run_until_complete(self._push.push(tensors, version=version))
        except (InferenceError, ConfigError) as exc:
            for _ in tensors:  # the other ranks are gathering the rest: keep in step with them
                pass
            return exc.message
        return None

    def close(self) -> None:
        def shut() -> None:
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(self._push.shutdown())
            self._loop.close()

        # A thread of its own: the caller may be inside a running event loop (a driver closing its trainer).
        closer = threading.Thread(target=shut, name="sandrl-weight-broadcast-close")
        closer.start()
        closer.join()
