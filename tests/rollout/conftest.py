"""Fixtures for the rollout tests: real bwrap sandboxes, real tasks, the tiny model in process and over HTTP.

Fakes only at the edges: :class:`ScriptedPolicy` is an InferenceClient that answers with given
replies (the random tiny model never writes a bash block), and :class:`RecordingProvider`
wraps the real provider to see (or refuse) what is created.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sandrl.errors import SandrlError
from sandrl.inference.base import Generation, SamplingParams
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.server import BackgroundServer, create_app
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.sandbox.base import Sandbox, SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks import Task, load_task, load_tasks
from sandrl.tasks.builtin import SUITE_DIR
from sandrl.tasks.builtin.generated import generate_tasks

from ..support import REASON


@pytest.fixture(scope="session")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BwrapProvider]:
    if REASON is not None:
        pytest.skip(REASON)
    p = BwrapProvider(tmp_path_factory.mktemp("rollout-state"))
    yield p
    p._close_all_sync()


@pytest.fixture(scope="session")
def task_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rollout-tasks")
    generate_tasks(root, "echo", 4, seed=0)
    generate_tasks(root, "count", 2, seed=0)
    return root


@pytest.fixture(scope="session")
def tasks(task_root: Path) -> list[Task]:
    loaded, problems = load_tasks(task_root)
    assert not problems
    return loaded


@pytest.fixture(scope="session")
def echo_task(tasks: list[Task]) -> Task:
    return next(t for t in tasks if t.id.startswith("echo-"))


@pytest.fixture(scope="session")
def builtin_tasks() -> list[Task]:
    """A few quick built-in tasks (Python, shell, git), run through their real verifiers."""
    return [load_task(SUITE_DIR / name) for name in ("shell-edit-config-file", "fix-flatten-recursion")]


@pytest.fixture(scope="session")
def tokenizer() -> ByteTokenizer:
    return ByteTokenizer()


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    eng = Engine.load("tiny", EngineConfig(seed=0))
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def served_url(engine: Engine) -> Iterator[str]:
    """The same engine behind a real uvicorn server (SGLang's routes)."""
    with BackgroundServer(create_app(engine)) as server:
        yield server.url


def answer_of(task: Task) -> str:
    assert task.verifier.tests_dir is not None
    return (task.verifier.tests_dir / "expected.txt").read_text().strip()


@dataclass
class ScriptedPolicy:
    """An InferenceClient that replies with the given texts in turn (then the last one again).

    Replies are the byte tokenizer's ids with ``<|im_end|>`` appended, each with log-prob -0.5;
    ``versions`` gives the weight version per reply.
    """

    replies: Sequence[str]
    versions: Sequence[int] = (0,)
    delay_s: float = 0.0
    calls: list[list[int]] = field(default_factory=list)

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        tok = ByteTokenizer()
        index = min(len(self.calls), len(self.replies) - 1)
        version = self.versions[min(len(self.calls), len(self.versions) - 1)]
        self.calls.append(list(input_ids))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        ids = [*tok.encode(self.replies[index]), tok.im_end_id]
        finish = "stop"
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], "length"
        return Generation(ids, [-0.5] * len(ids), finish, version, len(input_ids), start_weight_version=version)

    async def update_weights(self, path: str) -> int:
        raise NotImplementedError

    async def health(self) -> None:
        return None


def bash(command: str) -> str:
    return f"I will run this.\n```bash\n{command}\n```"


@dataclass
class RecordingProvider:
    """The real provider, remembering every sandbox it made; ``refuse`` makes create raise instead."""

    inner: BwrapProvider
    refuse: SandrlError | None = None
    refusals: int = 0
    created: list[Sandbox] = field(default_factory=list)
    live_peak: int = 0
    _live: int = 0

    async def create(self, spec: SandboxSpec) -> Sandbox:
        if self.refuse is not None:
            self.refusals += 1
            raise self.refuse
        sandbox = await self.inner.create(spec)
        self.created.append(sandbox)
        self._live += 1
        self.live_peak = max(self.live_peak, self._live)
        sandbox.add_close_callback(self._closed)
        return sandbox

    def _closed(self, sandbox: object) -> None:
        self._live -= 1

    @property
    def live(self) -> int:
        return self._live
