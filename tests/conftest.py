"""Suite-wide: an async test that hangs says where, before pytest-timeout ends it; real model families.

pytest-timeout dumps the threads' stacks, and for an event loop that waits on a future no one
will complete they show only ``select``. The watchdog prints every asyncio task's stack (what
each is awaiting) shortly before that timeout.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from .chat_families import build_model_dir, build_tokenizer_dir

WATCHDOG_LEAD_S = 15.0
"""How long before pytest-timeout fires the watchdog prints the tasks."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.function):
            item.fixturenames.append("_asyncio_watchdog")


def _await_chain(coro: object) -> list[str]:
    """Where a coroutine waits, outermost first (``Task.print_stack`` shows only its top frame)."""
    where = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            where.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None) or getattr(coro, "gi_yieldfrom", None)
    return where or ["(not started or finished)"]


@pytest.fixture
async def _asyncio_watchdog(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    marker = request.node.get_closest_marker("timeout")
    timeout_s = float(marker.args[0]) if marker and marker.args else float(request.config.getini("timeout") or 0)
    if timeout_s <= WATCHDOG_LEAD_S:
        yield
        return

    async def watch() -> None:
        await asyncio.sleep(timeout_s - WATCHDOG_LEAD_S)
        me = asyncio.current_task()
        waited = timeout_s - WATCHDOG_LEAD_S
        print(f"\n--- {request.node.nodeid}: still running after {waited:g} s; tasks:", file=sys.stderr)
        for task in asyncio.all_tasks():
            if task is not me:
                print(f"{task.get_name()}:", *_await_chain(task.get_coro()), sep="\n    ", file=sys.stderr)

    watchdog = asyncio.create_task(watch(), name="sandrl-test-watchdog")
    try:
        yield
    finally:
        watchdog.cancel()


FamilyDir = Callable[[str], Path]
"""A family's name (``chat_families.FAMILIES``) to its directory, built on first use."""


@pytest.fixture(scope="session")
def family_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> FamilyDir:
    """Tokenizer directories of real model families (real chat template, special tokens, eos lists), built once."""
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build_tokenizer_dir(family, tmp_path_factory.mktemp(f"tokenizer-{family}"))
        return built[family]

    return get


@pytest.fixture(scope="session")
def family_model_dir(tmp_path_factory: pytest.TempPathFactory) -> FamilyDir:
    """Checkpoints of real model families: the family's tokenizer and a tiny random model of its architecture."""
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build_model_dir(family, tmp_path_factory.mktemp(f"model-{family}"))
        return built[family]

    return get
