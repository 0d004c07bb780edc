"""A tool override: how an owner presents an upstream's tool to agents (its name, title, description, annotations,
parameters hidden, renamed, described or fixed, its structured output trimmed), and how a call is mapped back.

A plain value, so that whatever holds one (a tool of an upstream today, a virtual server's tool later) applies it
the same way. The upstream's own definition stays what pinning compares: an override never changes what is held.
"""

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from jsonschema.exceptions import SchemaError, UnknownType, ValidationError
from jsonschema.validators import Draft202012Validator
from referencing.exceptions import Unresolvable

from policy.manifest import tool_name_problem


class OverrideRefused(ValueError):
    """An override that cannot apply to the tool's definition; the message names what and why."""


class ArgumentsRefused(ValueError):
    """An agent's arguments that the exposed schema refuses; the message is the schema's error."""


@dataclass(frozen=True)
class Param:
    """What the agent sees of one of the upstream's input parameters."""

    hidden: bool = False  # the agent neither sees nor sets it; with `fixed`, the upstream receives `value`
    name: str = ""  # the agent's name for it ("": the upstream's)
    description: str = ""  # ("": the upstream's)
    fixed: bool = False
    value: Any = None

    @property
    def removed(self) -> bool:
        return self.hidden or self.fixed


@dataclass(frozen=True)
class Override:
    name: str = ""  # the tool part of the exposed name ("": the upstream's)
    title: str = ""
    description: str = ""
    annotations: dict[str, Any] | None = None
    params: dict[str, Param] = field(default_factory=dict)  # the upstream's parameter name -> what agents see
    output: tuple[str, ...] = ()  # structuredContent's fields kept (empty: all)

    @property
    def digest(self) -> str:
        """Of what it changes: derived texts (a TypeScript signature) are cached by it with the upstream's hash."""
        return hashlib.sha256(json.dumps(override_json(self), sort_keys=True).encode()).hexdigest()

    def definition(self, upstream: dict[str, Any]) -> dict[str, Any]:
        """The tool as agents see it (before the gateway sanitises and namespaces it)."""
        shown = dict(upstream)
        for key in ("title", "description"):
            if getattr(self, key):
                shown[key] = getattr(self, key)
        if self.annotations is not None:
            shown["annotations"] = self.annotations
        if isinstance(upstream.get("inputSchema"), dict):
            shown["inputSchema"] = self._input_schema(upstream["inputSchema"])
        if self.output and isinstance(upstream.get("outputSchema"), dict):
            shown["outputSchema"] = _trimmed_schema(upstream["outputSchema"], self.output)
        return shown

    def _input_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        properties, shown = _properties(schema), {}
        for original, spec in properties.items():
            param = self.params.get(original, Param())
            if param.removed:
                continue
            described = isinstance(spec, dict) and param.description
            shown[param.name or original] = spec | {"description": param.description} if described else spec
        required = [self.param_name(name) for name in _required(schema) if not self.param_removed(name)]
        return {**schema, "properties": shown} | ({"required": required} if "required" in schema else {})

    def param_name(self, original: str) -> str:
        return self.params.get(original, Param()).name or original

    def param_removed(self, original: str) -> bool:
        return self.params.get(original, Param()).removed

    def arguments(self, given: dict[str, Any], exposed_schema: dict[str, Any]) -> dict[str, Any]:
        """The arguments the upstream receives: the agent's, checked against the exposed schema (ArgumentsRefused),
        under the upstream's names, with the fixed values added."""
        hidden = [
            name for name in given if name not in (exposed_schema.get("properties") or {}) and self.param_removed(name)
        ]
        if hidden:  # worded as the exposed schema would refuse it with additionalProperties false
            raise ArgumentsRefused(f"Additional properties are not allowed ({hidden[0]!r} was unexpected)")
        error = _first_error(exposed_schema, given, ArgumentsRefused)
        if error is not None:
            where = "/".join(str(part) for part in error.absolute_path)
            raise ArgumentsRefused(f"{error.message} (at {where})" if where else error.message)
        back = {param.name: original for original, param in self.params.items() if param.name and not param.removed}
        sent = {back.get(name, name): value for name, value in given.items()}
        return sent | {original: param.value for original, param in self.params.items() if param.fixed}

    def result(self, result: dict[str, Any]) -> dict[str, Any]:
        """The result trimmed to the kept fields, its text block rebuilt from them; an error or unstructured result
        is left as it is."""
        structured = result.get("structuredContent")
        if not self.output or result.get("isError") or not isinstance(structured, dict):
            return result
        kept = {name: structured[name] for name in self.output if name in structured}
        return result | {"structuredContent": kept, "content": [{"type": "text", "text": json.dumps(kept)}]}


def _properties(schema: dict[str, Any]) -> dict[str, Any]:
    properties = schema.get("properties")
    return properties if isinstance(properties, dict) else {}


def _required(schema: dict[str, Any]) -> list[str]:
    required = schema.get("required")
    return [name for name in required if isinstance(name, str)] if isinstance(required, list) else []


# What an upstream's malformed schema raises (its schemas are its own words, checked only for size at sync).
UNCHECKABLE = (SchemaError, UnknownType, Unresolvable, TypeError, AttributeError)


def _first_error(schema: dict[str, Any], value: Any, refused: type[ValueError]) -> ValidationError | None:
    try:
        return next(iter(Draft202012Validator(schema).iter_errors(value)), None)
    except UNCHECKABLE as exc:
        raise refused(f"The tool's input schema cannot be checked: {exc}") from exc


def _trimmed_schema(schema: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    properties = _properties(schema)
    trimmed = {**schema, "properties": {name: properties[name] for name in fields if name in properties}}
    if "required" in schema:
        trimmed["required"] = [name for name in schema["required"] if name in fields]
    return trimmed


def override_check(override: Override, upstream: dict[str, Any]) -> None:
    """OverrideRefused unless the override fits the upstream's definition: a name by MCP's rules, parameters the
    upstream has, no two under one name, a required one hidden only with a fixed value, each fixed value valid for
    the upstream's schema, kept output fields the upstream's output schema has."""
    if override.name and (problem := tool_name_problem(override.name)):
        raise OverrideRefused(f"The name {override.name!r} is refused ({problem}).")
    schema = upstream.get("inputSchema") if isinstance(upstream.get("inputSchema"), dict) else {}
    properties, required = _properties(schema), set(_required(schema))
    shown: dict[str, str] = {}
    for original, param in override.params.items():
        if original not in properties:
            raise OverrideRefused(f"The tool has no parameter {original!r}.")
        if param.hidden and not param.fixed and original in required:
            raise OverrideRefused(f"Parameter {original!r} is required: give it a fixed value to hide it.")
        if param.fixed:
            _fixed_check(original, param.value, properties[original], schema)
    for original in properties:
        if not override.param_removed(original):
            exposed = override.param_name(original)
            if exposed in shown:
                raise OverrideRefused(
                    f"Parameters {shown[exposed]!r} and {original!r} would both be named {exposed!r}."
                )
            shown[exposed] = original
    _output_check(override.output, upstream.get("outputSchema"))


def _fixed_check(name: str, value: Any, spec: Any, root: dict[str, Any]) -> None:
    # Checked in the schema's own document, so that a `$ref` to its `$defs` resolves.
    schema = {**root, "type": "object", "properties": {name: spec}, "required": [name]}
    schema.pop("additionalProperties", None)
    error = _first_error(schema, {name: value}, OverrideRefused)
    if error is not None:
        raise OverrideRefused(f"The fixed value for {name!r} fails the tool's schema: {error.message}.")


def _output_check(fields: tuple[str, ...], schema: Any) -> None:
    if not fields:
        return
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        raise OverrideRefused("The tool declares no outputSchema with properties: its output cannot be trimmed.")
    if missing := [name for name in fields if name not in properties]:
        raise OverrideRefused(f"The tool's outputSchema has no field {missing[0]!r}.")


def override_stack(base: Override | None, top: Override) -> Override:
    """One override presenting the tool as `top` presents the tool `base` presents (a virtual server's over the
    upstream's). `top` names parameters as `base` shows them (override_check against `base`'s definition first), so
    it cannot bring back what `base` hides or fixes."""
    if base is None:
        return top
    back = {param.name: original for original, param in base.params.items() if param.name and not param.removed}
    params = dict(base.params)
    for shown, param in top.params.items():
        original = back.get(shown, shown)
        below = base.params.get(original, Param())
        name, described = param.name or below.name, param.description or below.description
        params[original] = Param(param.hidden, name, described, param.fixed, param.value)
    return Override(
        name=top.name or base.name,
        title=top.title or base.title,
        description=top.description or base.description,
        annotations=base.annotations if top.annotations is None else top.annotations,
        params=params,
        output=top.output or base.output,
    )


PARAM_KEYS = frozenset({"hidden", "name", "description", "value"})
OVERRIDE_FIELDS = ("name", "title", "description", "annotations", "params", "output")  # the console's order
OVERRIDE_KEYS = frozenset(OVERRIDE_FIELDS)


def override_parse(data: Any) -> Override:
    """The override a JSON object describes (as the REST API and the console take it), or OverrideRefused.
    A parameter is `{"hidden": true}`, `{"name": ..., "description": ...}`, or `{"value": ...}` (fixed)."""
    unknown = sorted(set(data) - OVERRIDE_KEYS) if isinstance(data, dict) else []
    if not isinstance(data, dict) or unknown:
        named = f": {unknown[0]!r} is not one of them." if unknown else "."
        raise OverrideRefused(f"An override is an object of {', '.join(sorted(OVERRIDE_KEYS))}{named}")
    for key in ("name", "title", "description"):
        if not isinstance(data.get(key, ""), str):
            raise OverrideRefused(f"{key!r} must be a string.")
    annotations, params, output = data.get("annotations"), data.get("params") or {}, data.get("output") or []
    if annotations is not None and not isinstance(annotations, dict):
        raise OverrideRefused("'annotations' must be an object.")
    if not isinstance(params, dict):
        raise OverrideRefused("'params' must be an object of parameter name -> what agents see of it.")
    if not isinstance(output, list) or not all(isinstance(name, str) for name in output):
        raise OverrideRefused("'output' must be a list of structuredContent field names.")
    return Override(
        name=data.get("name", ""),
        title=data.get("title", ""),
        description=data.get("description", ""),
        annotations=annotations,
        params={name: _param(name, spec) for name, spec in params.items()},
        output=tuple(output),
    )


def _param(name: str, spec: Any) -> Param:
    if not isinstance(spec, dict) or set(spec) - PARAM_KEYS:
        raise OverrideRefused(f"Parameter {name!r}: give an object of {', '.join(sorted(PARAM_KEYS))}.")
    renamed, described = spec.get("name", ""), spec.get("description", "")
    if (
        not isinstance(renamed, str)
        or not isinstance(described, str)
        or not isinstance(spec.get("hidden", False), bool)
    ):
        raise OverrideRefused(f"Parameter {name!r}: 'name' and 'description' are strings, 'hidden' true or false.")
    if renamed and tool_name_problem(renamed):
        raise OverrideRefused(f"Parameter {name!r}: the name {renamed!r} is not 1-128 characters of A-Z a-z 0-9 _ - .")
    fixed = "value" in spec
    return Param(
        hidden=spec.get("hidden", False), name=renamed, description=described, fixed=fixed, value=spec.get("value")
    )


def override_stored(override: Override) -> dict[str, Any]:
    """The fields a row of registry.models.OverrideFields holds the override in."""
    kept = {key: getattr(override, key) for key in ("name", "title", "description", "annotations")}
    return kept | {"params": override_json(override).get("params", {}), "output": list(override.output)}


def override_json(override: Override) -> dict[str, Any]:
    """The JSON object `override_parse` reads back."""
    params = {}
    for name, param in override.params.items():
        spec: dict[str, Any] = {"hidden": True} if param.hidden else {}
        spec |= {"name": param.name} if param.name else {}
        spec |= {"description": param.description} if param.description else {}
        params[name] = spec | ({"value": param.value} if param.fixed else {})
    data = {"name": override.name, "title": override.title, "description": override.description}
    data = {key: value for key, value in data.items() if value}
    if override.annotations is not None:
        data["annotations"] = override.annotations
    return (
        data | ({"params": params} if params else {}) | ({"output": list(override.output)} if override.output else {})
    )
