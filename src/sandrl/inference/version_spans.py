"""Per-token weight versions as vLLM spells them: spans of output tokens, one label each.

vLLM (0.34, ``return_weight_versions`` on ``/v1/completions``) answers each choice with
``weight_versions``: ``[{"version": label, "start": i, "end": j}, ...]``, meaning output tokens
``[i, j)`` were sampled by the weights labelled ``label``. sandrl keeps one int per token
(:attr:`~sandrl.inference.base.Generation.output_weight_versions`); these two functions convert
between the two, so sandrl's server answers in vLLM's shape and the vLLM client reads it.

Labels are strings: sandrl's versions are integers (the trainer's steps), and vLLM labels its
weights ``"default"`` until a version is set, which is sandrl's version 0.
"""

from __future__ import annotations

from typing import Any

from sandrl.inference.transport import parse_version

DEFAULT_LABEL = "default"
"""vLLM's (and SGLang's) label of the weights it started with."""


def to_spans(versions: list[int]) -> list[dict[str, Any]]:
    """``[0, 0, 1]`` -> ``[{"version": "0", "start": 0, "end": 2}, {"version": "1", "start": 2, "end": 3}]``."""
    spans: list[dict[str, Any]] = []
    for i, version in enumerate(versions):
        if spans and spans[-1]["version"] == str(version):
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": str(version), "start": i, "end": i + 1})
    return spans


def from_spans(spans: Any, count: int) -> list[int] | None:
    """One int version per output token, or None unless ``spans`` cover exactly ``[0, count)`` with int labels.

    None rather than a guess: a caller then falls back to the request's start and end versions.
    """
    if not isinstance(spans, list) or (count and not spans):
        return None
    out: list[int] = []
    for span in spans:
        if not isinstance(span, dict):
            return None
        label = span.get("version")
        version = 0 if label == DEFAULT_LABEL else parse_version(label)
        start, end = span.get("start"), span.get("end")
        if version is None or start != len(out) or not isinstance(end, int) or end < start:
            return None
        out.extend([version] * (end - start))
    return out if len(out) == count else None
