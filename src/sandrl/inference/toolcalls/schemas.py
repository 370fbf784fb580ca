"""Tool calls checked against the tools a request offered, in sentences the model can act on.

The tools are OpenAI-style specs, ``{"type": "function", "function": {"name", "description",
"parameters": <JSON schema>}}``. A call is checked the way a model needs to hear about it: the
tool exists, its required arguments are there, each argument has the JSON type its schema names
(string, integer, number, boolean, object, array, null; a list of types means any of them), an
``enum`` holds the value, and no argument is left over when the schema says
``"additionalProperties": false``. That is the part of JSON Schema tool specs use in practice;
nested schemas are not walked.

A malformed *spec* is the caller's mistake, not the model's, so it raises :class:`ConfigError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sandrl.errors import ConfigError

if TYPE_CHECKING:
    from sandrl.inference.toolcalls.call import ToolCall

_ARTICLE_TYPES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean (true or false)",
    "object": "an object",
    "array": "an array",
    "null": "null",
}


def tool_schemas(tools: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The parameters schema of each offered tool, by name.

    Accepts the OpenAI form ``{"type": "function", "function": {...}}`` and the bare function
    object ``{"name", "parameters"}``; a tool without ``parameters`` takes none.
    """
    schemas: dict[str, Mapping[str, Any]] = {}
    for i, tool in enumerate(tools):
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(name, str) or not name:
            raise ConfigError(
                f"tool {i} is not a function spec: expected "
                f'{{"type": "function", "function": {{"name": ..., "parameters": {{...}}}}}}, got {tool!r}'
            )
        parameters = function.get("parameters") or {}
        if not isinstance(parameters, Mapping):
            raise ConfigError(f"tool {name!r}: 'parameters' must be a JSON schema object, got {parameters!r}")
        schemas[name] = parameters
    return schemas


def argument_schema(tools: Sequence[Mapping[str, Any]], tool: str, argument: str) -> Mapping[str, Any]:
    """The schema of one argument of one offered tool; empty when either is unknown (or the specs are malformed)."""
    try:
        schema = tool_schemas(tools).get(tool, {})
    except ConfigError:
        return {}
    properties = schema.get("properties")
    found = properties.get(argument) if isinstance(properties, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def declared_types(schema: Mapping[str, Any]) -> tuple[str, ...]:
    """The JSON types a schema allows (``type`` as a string or a list); empty when it names none."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return (declared,)
    if isinstance(declared, list):
        return tuple(t for t in declared if isinstance(t, str))
    return ()


def json_type(value: Any) -> str:
    """The JSON type of a decoded value, as JSON Schema names it (an integral float is an integer there too)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _type_fits(value: Any, allowed: tuple[str, ...]) -> bool:
    actual = json_type(value)
    return actual in allowed or (actual == "integer" and "number" in allowed)


def check_calls(calls: Sequence[ToolCall], tools: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """One sentence per problem of ``calls`` against ``tools``, numbering the calls from 1; none when all fit."""
    schemas = tool_schemas(tools)
    errors: list[str] = []
    for n, call in enumerate(calls, start=1):
        schema = schemas.get(call.name)
        if schema is None:
            known = ", ".join(sorted(schemas)) or "none (no tools were offered)"
            errors.append(f"tool call {n} names an unknown tool {call.name!r}; the tools are: {known}.")
            continue
        errors.extend(_check_arguments(f"tool call {n} ({call.name})", call.arguments, schema))
    return tuple(errors)


def _check_arguments(where: str, arguments: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required = schema.get("required")
    errors = [
        f"{where} is missing the required argument {key!r}."
        for key in (required if isinstance(required, list) else [])
        if isinstance(key, str) and key not in arguments
    ]
    for key, value in arguments.items():
        prop = properties.get(key)
        if not isinstance(prop, Mapping):
            if schema.get("additionalProperties") is False:
                takes = ", ".join(repr(k) for k in properties) or "no arguments"
                errors.append(f"{where} has an unexpected argument {key!r}; it takes {takes}.")
            continue
        allowed = declared_types(prop)
        if allowed and not _type_fits(value, allowed):
            wanted = " or ".join(_ARTICLE_TYPES.get(t, t) for t in allowed)
            errors.append(f"{where}: argument {key!r} must be {wanted}, got {_describe(value)}.")
            continue
        enum = prop.get("enum")
        if isinstance(enum, list) and value not in enum:
            options = ", ".join(repr(v) for v in enum)
            errors.append(f"{where}: argument {key!r} must be one of {options}, got {value!r}.")
    return errors


def _describe(value: Any) -> str:
    text = repr(value)
    shown = text if len(text) <= 40 else text[:37] + "..."
    return f"{_ARTICLE_TYPES.get(json_type(value), json_type(value))} ({shown})"
