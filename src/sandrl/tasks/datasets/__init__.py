"""Datasets by name: Harbor's dataset registry, and its tasks fetched with git into a local cache.

::

    datasets, note = read_registry(default_registry(), cache_root())
    dataset = find_dataset(datasets, "terminal-bench", "2.0", source)
    report = pull_dataset(dataset, Path("datasets/terminal-bench@2.0"))   # then: sandrl eval DIR

:mod:`~sandrl.tasks.datasets.registry` reads the registry, :mod:`~sandrl.tasks.datasets.git` runs
git on what it names (hostile input), :mod:`~sandrl.tasks.datasets.fetch` keeps the cache and
:mod:`~sandrl.tasks.datasets.pull` writes the dataset directory (``sandrl tasks pull``).
"""

from sandrl.tasks.datasets.fetch import cache_root
from sandrl.tasks.datasets.pull import PullReport, TaskOutcome, pull_dataset
from sandrl.tasks.datasets.registry import (
    DEFAULT_REGISTRY,
    Dataset,
    default_registry,
    find_dataset,
    parse_spec,
    read_registry,
)

__all__ = [
    "DEFAULT_REGISTRY",
    "Dataset",
    "PullReport",
    "TaskOutcome",
    "cache_root",
    "default_registry",
    "find_dataset",
    "parse_spec",
    "pull_dataset",
    "read_registry",
]
