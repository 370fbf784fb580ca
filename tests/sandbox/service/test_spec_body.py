"""The HTTP API's spec (SpecBody) is derived from SandboxSpec: the same fields, defaults and bounds."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from sandrl.errors import InvalidSpecError
from sandrl.sandbox.base import Bounds, SandboxSpec
from sandrl.sandbox.remote.wire import SpecBody


def test_defaults_are_the_specs() -> None:
    assert SpecBody().to_spec() == SandboxSpec()
    assert SpecBody.from_spec(SandboxSpec()) == SpecBody()


@pytest.mark.parametrize("field", [f for f in dataclasses.fields(SandboxSpec) if "bounds" in f.metadata])
def test_out_of_bounds_is_refused_by_both(field: dataclasses.Field[object]) -> None:
    bounds = field.metadata["bounds"]
    assert isinstance(bounds, Bounds)
    outside = [bounds.low - 1] + ([bounds.high + 1] if bounds.high is not None else [])
    for value in outside:
        with pytest.raises(InvalidSpecError, match=field.name):
            SandboxSpec(**{field.name: value})  # type: ignore[arg-type]
        with pytest.raises(ValidationError, match=field.name):
            SpecBody.model_validate({field.name: value})
