"""One tool call, as parsers read it and OpenAI messages carry it; and the strict JSON its arguments are read with."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sandrl.errors import ConfigError


@dataclass(frozen=True)
class ToolCall:
    """One call of one tool, with its arguments decoded."""

    name: str
    arguments: dict[str, Any]
    id: str = ""
    """The OpenAI call id; parsers assign ``call_<index>`` (the call's place in the reply's ``tool_calls``)."""

    def to_openai(self) -> dict[str, Any]:
        """The call as an OpenAI chat message carries it: arguments as a JSON string."""
        arguments = json.dumps(self.arguments, ensure_ascii=False)
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": arguments}}

    def for_template(self) -> dict[str, Any]:
        """The call as chat templates want it in an assistant message: arguments as an object.

        OpenAI's JSON-string arguments break them: GLM-4.5's template fails on a string (it calls
        ``.items()``), Qwen2.5's and Llama 3.1's encode it a second time; only Qwen3's takes both.
        """
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    @classmethod
    def from_openai(cls, data: Mapping[str, Any]) -> ToolCall:
        """Read an OpenAI tool call; its ``arguments`` may be a JSON string (as OpenAI sends) or an object."""
        function = data.get("function") if isinstance(data, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function["name"]:
            raise ConfigError(
                "a tool call needs a 'function' object with a non-empty string 'name', as "
                '{"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": "{}"}}; '
                f"got {data!r}"
            )
        if data.get("type", "function") != "function":
            raise ConfigError(f"a tool call's 'type' must be 'function', got {data.get('type')!r}")
        call_id = data.get("id") or ""
        if not isinstance(call_id, str):
            raise ConfigError(f"a tool call's 'id' must be a string, got {call_id!r}")
        arguments = function.get("arguments")
        if arguments is None or arguments == "":
            arguments = {}
        elif isinstance(arguments, str):
            decoded, problem = load_json(arguments)
            if problem is not None:
                raise ConfigError(f"tool call {function['name']!r}: 'arguments' is not valid JSON ({problem})")
            arguments = decoded
        if not isinstance(arguments, Mapping):
            raise ConfigError(f"tool call {function['name']!r}: 'arguments' must be a JSON object, got {arguments!r}")
        return cls(function["name"], dict(arguments), call_id)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text} is too large")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


STRICT_JSON = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)
"""Strict JSON: NaN, Infinity and overflowing numbers are refused, so what is parsed can be sent on as JSON."""


def load_json(text: str) -> tuple[Any, str | None]:
    """``(value, None)``, or ``(None, why)`` when ``text`` is not one JSON value (deep nesting included)."""
    try:
        return STRICT_JSON.decode(text), None
    except RecursionError:
        return None, "it is nested too deeply"
    except ValueError as exc:
        return None, str(exc)
