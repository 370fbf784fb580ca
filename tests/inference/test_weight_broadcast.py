"""Weights without the disk: a trainer-side rank 0 broadcasts over gloo, or writes through shared memory, to two
embedded servers (SGLang's protocol), whose weights then equal the disk path's bit for bit; wrong buckets are
refused whole; the shared-memory segment is checked and leaves nothing behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from sandrl.errors import ConfigError, InferenceError
from sandrl.inference.base import SamplingParams
from sandrl.inference.engine import Engine
from sandrl.inference.model import build_tiny_model
from sandrl.inference.server import BackgroundServer, create_app
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.inference.weight_group import GroupAddress
from sandrl.inference.weight_push import DEFAULT_BUCKET_BYTES, BroadcastSpec, WeightBroadcast, buckets, model_weights
from sandrl.inference.weight_shm import SHM_DIR, SharedMemoryGroup, segment_path, shm_room

from .conftest import TOKEN, Served

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def two_served() -> Iterator[list[Served]]:
    engines = [Engine.load("tiny") for _ in range(2)]
    servers = [BackgroundServer(create_app(e, token=TOKEN)).start() for e in engines]
    yield [Served(e, s.url, None, TOKEN) for e, s in zip(engines, servers, strict=True)]
    for server, engine in zip(servers, engines, strict=True):
        server.stop()
        engine.close()


def _new_weights(seed: int = 1) -> dict[str, torch.Tensor]:
    model, _ = build_tiny_model(TinyModelConfig(seed=seed))
    return dict(model_weights(model))  # the tied output layer once, as the trainer sends it


def _state(engine: Engine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.model.state_dict().items()}


@pytest.fixture(params=["gloo", "shm"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _broadcast(served: list[Served], backend: str = "gloo", **kwargs: Any) -> WeightBroadcast:
    return WeightBroadcast(BroadcastSpec(tuple(s.url for s in served), api_key=TOKEN, backend=backend, **kwargs))


def _segments() -> set[Path]:
    return set(SHM_DIR.glob("sandrl-weights-*"))


async def test_broadcast_equals_the_disk_path_bit_for_bit(
    two_served: list[Served], other_checkpoint: Path, backend: str
) -> None:
    by_disk = Engine.load("tiny")
    try:
        await by_disk.update_weights(str(other_checkpoint), version=7)
        push = _broadcast(two_served, backend, bucket_bytes=64 * 1024)  # several buckets
        try:
            new = _new_weights(seed=1)
            assert len(list(buckets(new.items(), 64 * 1024))) > 2
            assert await push.push(new.items(), version=7) == 7
            expected = _state(by_disk)
            for served in two_served:
                assert served.engine.weight_version == 7
                got = _state(served.engine)
                assert got.keys() == expected.keys()
                assert all(torch.equal(got[k], expected[k]) for k in expected)
            # and generation after it is the disk path's
            params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)
            a = await two_served[0].engine.generate([1, 2, 3], params)
            b = await by_disk.generate([1, 2, 3], params)
            assert a.output_ids == b.output_ids and a.weight_version == b.weight_version == 7
            # a second push reuses the group and advances the version
            assert await push.push(_new_weights(seed=2).items(), version=8) == 8
            assert all(s.engine.weight_version == 8 for s in two_served)
        finally:
            await push.shutdown()
    finally:
        by_disk.close()


async def test_a_push_is_received_into_the_tensors_the_push_before_it_let_go(
    two_served: list[Served], backend: str
) -> None:
    engine = two_served[0].engine
    launched = {k: v for k, v in engine.model.state_dict().items()}  # held here: never freed, never reused by chance
    push = _broadcast(two_served, backend)
    try:
        await push.push(_new_weights(seed=1).items(), version=1)
        second = _new_weights(seed=2)
        await push.push(second.items(), version=2)
    finally:
        await push.shutdown()
    now = engine.model.state_dict()
    # Every weight of push 2 landed in the memory the launch weights had (no fresh buffer: no page faults) ...
    assert all(now[k].data_ptr() == launched[k].data_ptr() for k in second)
    # ... and holds push 2's values, bit for bit (the tied output layer too).
    assert all(torch.equal(now[k], second[k]) for k in second)
    assert torch.equal(now["lm_head.weight"], second["model.embed_tokens.weight"])


@pytest.mark.parametrize(
    ("spoil", "named"),
    [
        (lambda w: {**w, "model.norm.weight": torch.zeros(3, 5)}, "model.norm.weight"),
        (lambda w: {**w, "no.such.weight": torch.zeros(4)}, "no.such.weight"),
        (lambda w: {**w, "model.norm.weight": w["model.norm.weight"].to(torch.int64)}, "model.norm.weight"),
    ],
    ids=["wrong-shape", "unknown-name", "integer-dtype"],
)
async def test_a_wrong_bucket_is_refused_by_name_and_nothing_is_applied(
    two_served: list[Served], spoil: Any, named: str, backend: str
) -> None:
    before = [_state(s.engine) for s in two_served]
    push = _broadcast(two_served, backend, bucket_bytes=1 << 30)  # one bucket: the good tensors travel with the bad one
    try:
        with pytest.raises(InferenceError, match=named.replace(".", r"\.")):
            await push.push(spoil(_new_weights()).items(), version=5)
        for served, old in zip(two_served, before, strict=True):
            assert served.engine.weight_version == 0
            now = _state(served.engine)
            assert all(torch.equal(now[k], old[k]) for k in old)
        # the engines are not wedged: a good push forms a new group and lands
        assert await push.push(_new_weights().items(), version=5) == 5
        assert all(s.engine.weight_version == 5 for s in two_served)
    finally:
        await push.shutdown()


async def test_a_push_of_part_of_the_weights_stages_and_applies_nothing(two_served: list[Served], backend: str) -> None:
    push = _broadcast(two_served, backend, bucket_bytes=1 << 30)
    try:
        half = list(_new_weights().items())[:3]
        with pytest.raises(InferenceError, match="only part"):
            await push.push(half, version=4)
        assert all(s.engine.weight_version == 0 for s in two_served)
    finally:
        await push.shutdown()


async def test_group_requests_are_checked_and_control_routes_need_the_token(two_served: list[Served]) -> None:
    import httpx

    url = two_served[0].url
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        body = {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2}
        assert (await http.post("/init_weights_update_group", json=body)).status_code in (401, 403)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        r = await http.post("/init_weights_update_group", json=body, headers=headers)  # nccl by default: no GPU here
        if not torch.cuda.is_available():
            assert r.status_code == 400 and "gloo" in r.json()["message"]
        r = await http.post(
            "/init_weights_update_group", json={**body, "world_size": 1, "backend": "gloo"}, headers=headers
        )
        assert r.status_code == 400 and "world_size" in r.json()["message"]
        update = {"names": ["x"], "dtypes": ["float32"], "shapes": [[1]], "group_name": "nope"}
        r = await http.post("/update_weights_from_distributed", json=update, headers=headers)
        assert r.status_code == 400 and "no weight-update group" in r.json()["message"]


def test_group_address_is_checked() -> None:
    with pytest.raises(ConfigError, match="group_name"):
        GroupAddress("127.0.0.1", 1234, 2, "bad name!", "gloo")
    with pytest.raises(ConfigError, match="backend"):
        GroupAddress("127.0.0.1", 1234, 2, "g", "mpi")
    assert GroupAddress("127.0.0.1", 1234, 2, "g").loopback


async def test_engines_on_this_host_get_the_weights_through_shared_memory_and_it_leaves_nothing(
    two_served: list[Served],
) -> None:
    if shm_room() < DEFAULT_BUCKET_BYTES:
        pytest.skip(f"/dev/shm has {shm_room()} bytes free here, less than a bucket")
    before = _segments()
    push = WeightBroadcast(BroadcastSpec(tuple(s.url for s in two_served), api_key=TOKEN, backend=""))
    assert push.spec.backend == "shm"  # chosen: every engine on loopback, sandrl's engines
    try:
        new = _new_weights(seed=4)
        await push.connect()
        assert _segments() == before  # its name is gone once both engines hold it open
        assert await push.push(new.items(), version=3) == 3
        assert all(torch.equal(s.engine.model.state_dict()[k], new[k]) for s in two_served for k in new)
    finally:
        await push.shutdown()
    assert _segments() == before
    assert all(s.engine.weight_update_groups == [] for s in two_served)


def test_a_small_dev_shm_keeps_the_broadcast_on_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    urls = ("http://127.0.0.1:1", "http://127.0.0.1:2")
    assert WeightBroadcast(BroadcastSpec(urls, backend="", bucket_bytes=2**20)).spec.backend == "shm"
    # a container's /dev/shm (64 MiB) holds no bucket of 256 MiB
    monkeypatch.setattr("sandrl.inference.weight_push.shm_room", lambda: 64 * 2**20)
    assert WeightBroadcast(BroadcastSpec(urls, backend="", bucket_bytes=256 * 2**20)).spec.backend == "gloo"
    # engines on another host, or SGLang's: never shared memory
    assert WeightBroadcast(BroadcastSpec(("http://127.0.0.1:1",), backend="", sglang=True)).spec.backend == "gloo"
    assert (
        WeightBroadcast(BroadcastSpec(("http://10.9.8.7:1",), master_address="10.9.8.6", backend="")).spec.backend
        == "gloo"
    )


async def test_an_engine_that_cannot_open_the_segment_makes_the_group_fall_back_to_gloo(
    two_served: list[Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The engines look for the segment elsewhere, as an engine in another /dev/shm would.
    monkeypatch.setattr(SharedMemoryGroup, "join", _join_elsewhere(SharedMemoryGroup.join))
    push = WeightBroadcast(BroadcastSpec(tuple(s.url for s in two_served), api_key=TOKEN, backend=""))
    try:
        assert await push.push(_new_weights(seed=5).items(), version=2) == 2
        assert push.spec.backend == "gloo"
        assert all(s.engine.weight_version == 2 and len(s.engine.weight_update_groups) == 1 for s in two_served)
    finally:
        await push.shutdown()
    # named explicitly, the refusal says what to do
    explicit = _broadcast(two_served, "shm")
    try:
        with pytest.raises(InferenceError, match="backend 'gloo'"):
            await explicit.connect()
    finally:
        await explicit.shutdown()


def _join_elsewhere(join: Any) -> Any:
    def elsewhere(group_name: str, rank: int) -> SharedMemoryGroup:
        return join(group_name if rank == 0 else "elsewhere", rank)  # type: ignore[no-any-return]

    return staticmethod(elsewhere)


@pytest.mark.parametrize("spoil", ["symlink", "writable-by-others", "short"])
def test_an_engine_refuses_a_segment_it_cannot_trust(spoil: str, tmp_path: Path) -> None:
    name = f"test-{spoil}-{tmp_path.name}"
    path = segment_path(name)
    trainer = None
    try:
        if spoil == "symlink":
            target = tmp_path / "elsewhere"
            target.write_bytes(b"\0" * 64)
            path.symlink_to(target)
        elif spoil == "writable-by-others":
            path.write_bytes(b"\0" * 64)
            path.chmod(0o666)
        else:
            trainer = SharedMemoryGroup.join(name, 0)
            trainer.broadcast([torch.ones(4)])  # 16 bytes written ...
        if spoil == "short":
            engine = SharedMemoryGroup.join(name, 1)
            with pytest.raises(InferenceError, match="fewer bytes"):
                engine.broadcast([torch.empty(64)])  # ... 256 declared: a short read, not a SIGBUS
            engine.close()
        else:
            with pytest.raises(ConfigError, match="weight segment"):
                SharedMemoryGroup.join(name, 1)
    finally:
        if trainer is not None:
            trainer.close()
        path.unlink(missing_ok=True)
    assert not path.exists()


def test_a_shared_memory_group_is_for_this_host_only() -> None:
    with pytest.raises(ConfigError, match="loopback"):
        GroupAddress("10.1.2.3", 1234, 2, "g", "shm")


async def test_an_sglang_engine_joins_with_one_rank_per_tensor_parallel_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    push = WeightBroadcast(
        BroadcastSpec(("http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"), backend="gloo", sglang=True)
    )
    answers = iter([{"tp_size": 2}, {"tp_size": 4}, {"tp_size": True}])  # a bool is no size: one rank

    async def server_info(path: str) -> dict[str, object]:
        assert path == "/get_server_info"
        return next(answers)

    for engine in push.engines:
        monkeypatch.setattr(engine, "get", server_info)
    assert await push._ranks() == ([1, 3, 7], 8)
