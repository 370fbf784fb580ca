"""How much sandrl fetches at once, and for how long, unless told otherwise.

The fetchers' defaults (:mod:`sandrl.rollout.prefetch`, :mod:`sandrl.tasks.datasets.pull`) and the
defaults their ``sandrl`` flags show. A module of its own at the foundation: every command builds
its whole parser before it runs, and importing these from the fetchers would load the rollout and
task packages (a registry client, the loaders: ~0.2 s) for ``sandrl --help``.
"""

from __future__ import annotations

PREFETCH_JOBS = 4
"""Images fetched ahead at once, by default: a registry's downloads and a host's unpacking both
saturate at a few pulls, and the first tasks' images come sooner than with all at once."""
DATASET_JOBS = 8
"""A dataset's repositories fetched at once by ``sandrl tasks pull``."""
DATASET_GIT_TIMEOUT_S = 1800.0
"""Seconds one git command of a dataset's pull may take."""
