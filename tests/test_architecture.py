"""The shape of the code: imports run one way, modules stay small, each seam is crossed in one place.

The import graph is built from the source with ``ast``: every ``import`` counts, including lazy
ones inside functions (they run too, just later); only ``if TYPE_CHECKING:`` blocks do not.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("sandrl.images",),
    ("sandrl.sandbox", "sandrl.inference"),
    ("sandrl.tasks",),
    ("sandrl.rollout",),
    ("sandrl.wiring",),
    ("sandrl.train",),
    ("sandrl.cluster",),
    ("sandrl.bench", "sandrl.demo", "sandrl.view"),
    ("sandrl.cli",),
)
"""Packages from the bottom up: a package imports only from layers below its own. Modules at the
top of ``sandrl`` (``errors``, ``aio``, ...) are the foundation under all of them and import only
each other. Two packages in one layer are independent of each other."""

MAX_LINES = 600
GENERATED = re.compile(r"/proto/")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in SRC.rglob("*.py")}


def _type_checking_only(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                for child in node.body:
                    skipped.update(id(n) for n in ast.walk(child))
    return skipped


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    modules = _modules()
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = module if modules[module].name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        prefix = (base + ("." + node.module if node.module else "")) if node.level else (node.module or "")
        targets = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix for alias in node.names]
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target.startswith("sandrl") and target != module:
            yield target


@cache
def _graph(*, type_only: bool = False) -> dict[str, frozenset[str]]:
    """Module -> the sandrl modules it imports; with ``type_only``, ``if TYPE_CHECKING:`` imports too."""
    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in _modules().items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = set() if type_only else _type_checking_only(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in skipped:
                edges[module].update(_imported(module, node))
    return {m: frozenset(edges.get(m, ())) for m in _modules()}


def _cycles(nodes: list[str], edges: dict[str, frozenset[str]] | dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _package(module: str) -> str:
    """``sandrl.<package>`` for a module in a package; the module itself at the top of ``sandrl``."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and _modules()[module].name == "__init__.py"):
        return ".".join(parts[:2])
    return module


def _layer(package: str) -> int:
    for i, names in enumerate(LAYERS, start=1):
        if package in names:
            return i
    return 0  # the foundation: sandrl itself and the modules at its top


def test_no_import_cycle_between_files() -> None:
    graph = _graph()
    assert _cycles(sorted(graph), graph) == []


def test_no_import_cycle_between_files_even_through_type_hints() -> None:
    # A circle that only type hints close still ties two modules into one: a type both use
    # belongs in a module under both.
    graph = _graph(type_only=True)
    assert _cycles(sorted(graph), graph) == []


def test_no_import_cycle_between_packages() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    for module, targets in _graph().items():
        for target in targets:
            if _package(module) != _package(target):
                edges[_package(module)].add(_package(target))
    assert _cycles(sorted(edges), edges) == []


def _part_cycles(graph: dict[str, frozenset[str]]) -> list[str]:
    """Circles between the parts of one package: its modules and sub-packages, each taken whole."""
    found = []
    for package in sorted(m for m, path in _modules().items() if path.name == "__init__.py"):
        prefix = package + "."
        edges: dict[str, set[str]] = defaultdict(set)
        for module, targets in graph.items():
            if not module.startswith(prefix):
                continue
            here = module[len(prefix) :].partition(".")[0]
            for target in targets:
                there = target[len(prefix) :].partition(".")[0] if target.startswith(prefix) else None
                if there is not None and there != here:
                    edges[here].add(there)
        found += [f"{package}: {' <-> '.join(cycle)}" for cycle in _cycles(sorted(edges), edges)]
    return found


def test_no_import_cycle_inside_a_package() -> None:
    # Two parts of a package that import each other (a module and a sub-package, two sub-packages) are
    # one part in two places, even when no two files close the circle: what both use goes under both.
    assert _part_cycles(_graph()) == []
    assert _part_cycles(_graph(type_only=True)) == []


def test_every_package_has_a_layer() -> None:
    packages = {_package(m) for m in _modules()}
    unplaced = sorted(p for p in packages if _modules()[p].name == "__init__.py" and p != "sandrl" and _layer(p) == 0)
    assert unplaced == [], "add each package to LAYERS"


def test_imports_only_run_down() -> None:
    upward = []
    for module, targets in sorted(_graph().items()):
        for target in sorted(targets):
            here, there = _package(module), _package(target)
            foundation = _layer(here) == _layer(there) == 0  # errors, aio...: cycles are caught above
            if here != there and _layer(there) >= _layer(here) and not foundation and here != "sandrl":
                upward.append(f"{module} -> {target}")
    assert upward == []


BACKENDS = ("sandrl.sandbox.bwrap", "sandrl.sandbox.remote", "sandrl.sandbox.e2b")
BACKEND_CROSSINGS = {("sandrl.sandbox.e2b.templates", "sandrl.sandbox.bwrap")}
"""The one backend that reaches into another: an E2B template is built on a sandrl host by the
bubblewrap backend's Dockerfile builder (``sandrl images templates --build``)."""


def test_a_backend_reaches_into_no_other_backend_nor_the_service_nor_admission() -> None:
    leaks = []
    for module, targets in sorted(_graph().items()):
        home = next((b for b in BACKENDS if module == b or module.startswith(b + ".")), None)
        if home is None:
            continue
        for target in sorted(targets):
            there = next((b for b in BACKENDS if target == b or target.startswith(b + ".")), None)
            crossing = there is not None and there != home and (module, there) not in BACKEND_CROSSINGS
            if crossing or target.startswith(("sandrl.sandbox.service", "sandrl.sandbox.admission")):
                leaks.append(f"{module} -> {target}")
    assert leaks == []


SERVER_FRAMEWORKS = ("fastapi", "starlette", "uvicorn")


def _third_party_imports(module: str) -> set[str]:
    """The top-level names of the packages outside sandrl that ``module`` imports (``if TYPE_CHECKING:`` aside)."""
    tree = ast.parse(_modules()[module].read_text())
    skipped = _type_checking_only(tree)
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names - {"sandrl"}


def test_the_client_and_the_backends_load_no_server_code() -> None:
    """The sandbox service imports the remote client's wire types, never the other way: a client
    (or any backend) loads neither the service nor a web framework. Only the service's own
    modules, in ``sandbox/``, may."""
    graph = _graph()
    outside = sorted(m for m in graph if m.startswith("sandrl.sandbox") and not m.startswith("sandrl.sandbox.service"))
    leaks = sorted(
        [f"{m} -> {t}" for m in outside for t in graph[m] if t.startswith("sandrl.sandbox.service")]
        + [f"{m} -> {t}" for m in outside for t in _third_party_imports(m) if t in SERVER_FRAMEWORKS]
    )
    assert leaks == []


def test_modules_are_small() -> None:
    big = sorted(
        f"{path.relative_to(SRC)}: {n} lines"
        for path in _modules().values()
        if not GENERATED.search(path.as_posix()) and (n := len(path.read_text().splitlines())) > MAX_LINES
    )
    assert big == []


def _call_sites(match: Callable[[ast.Call], bool]) -> list[str]:
    """``path:line`` of every call in ``src`` that ``match`` picks (code only: docstrings do not count)."""
    return sorted(
        f"{path.relative_to(SRC)}:{node.lineno}"
        for path in _modules().values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and match(node)
    )


def _name(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def test_components_are_built_in_one_place() -> None:
    """A config mapped onto a component is mapped once (a bare ``RunnerConfig()`` is its defaults)."""
    for constructor in ("RunnerConfig", "LLMAgentConfig", "load_tokenizer"):
        sites = _call_sites(
            lambda call, name=constructor: _name(call.func) == name and bool(call.args or call.keywords)  # type: ignore[misc]
        )
        if constructor == "load_tokenizer":  # a checkpoint loads its own; everything else asks the wiring
            sites = [s for s in sites if not s.startswith("sandrl/inference/")]
        assert len(sites) <= 1, f"{constructor}(...) is built in more than one place: {sites}"


def test_no_backend_or_policy_sniffing_outside_their_packages() -> None:
    def sniffs(call: ast.Call) -> bool:
        if _name(call.func) == "isinstance" and len(call.args) == 2:
            classes = [n for n in ast.walk(call.args[1]) if isinstance(n, ast.expr)]
            return any(_name(n) in ("BwrapProvider", "Engine") for n in classes)
        if _name(call.func) == "getattr" and call.args:
            return _name(call.args[0]) in ("policy", "engine")
        return False

    sites = [s for s in _call_sites(sniffs) if not s.startswith(("sandrl/sandbox/", "sandrl/inference/"))]
    assert sites == []


def test_the_cli_and_reading_a_run_config_load_no_pytorch() -> None:
    """``sandrl --help`` and a bad key in a run config answer in well under a second: PyTorch,
    transformers and peft (~2 s to import) load only where a model is built."""
    import subprocess
    import sys

    heavy = ("torch", "transformers", "peft")
    for module in ("sandrl.cli", "sandrl.train.run_config"):
        code = f"import sys, {module}; print(','.join(m for m in {heavy!r} if m in sys.modules))"
        loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert loaded.strip() == "", f"importing {module} loads {loaded.strip()}"


def test_the_architecture_page_names_every_package_and_top_level_module() -> None:
    page = (SRC.parents[0] / "docs" / "architecture.md").read_text()
    named = {m.split(".")[1] for m in _modules() if m.count(".") >= 1}
    missing = sorted(n for n in named if f"`{n}`" not in page and f"`{n}/`" not in page)
    assert missing == [], "docs/architecture.md: say what these are"


def test_providers_are_built_only_in_the_wiring() -> None:
    """Every command builds its sandboxes through ``sandrl.wiring`` (so each can take ``--sandboxes``);
    inside ``sandbox/`` a provider is the layer's own business (the service's default provider)."""
    sites = _call_sites(lambda call: _name(call.func) == "BwrapProvider")
    outside = [s for s in sites if not s.startswith(("sandrl/wiring/", "sandrl/sandbox/"))]
    assert outside == []
