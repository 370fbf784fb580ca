"""For tests that land a weight update mid-generation: when every request is decoding."""

from __future__ import annotations

from sandrl.inference.engine import Engine


def all_decoding(engine: Engine, count: int, since_steps: int, *, tokens: int = 2, steps: int = 5) -> bool:
    """``count`` requests in the running batch, each with ``tokens`` decoded already (of the weights
    before the update), and ``steps`` decode steps since ``since_steps``: a request still waiting for
    its prefill when the update lands would have no token of the old weights."""
    decoding = list(engine._batch.requests)
    done = len(decoding) == count and all(len(r.output_ids) >= tokens for r in decoding)
    return done and engine.stats.steps >= since_steps + steps
