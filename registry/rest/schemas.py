"""An OpenAPI schema as the JSON Schema an MCP client checks against. OpenAPI 3.0's `nullable` is no JSON
Schema keyword, so a null that the document allows would fail a client's check: it becomes a `null` type.
An answer's schema is also loosened from `oneOf` to `anyOf`: documents use `oneOf` where the branches overlap
(drf-spectacular writes `oneOf: [uri string, empty string]` for a URL that may be blank, and "" is both), and
a client that checks strictly would refuse the service's good answer. Every instance valid before stays valid."""

from typing import Any


def json_schema(schema: Any, *, answer: bool = False) -> Any:
    """`schema` with `nullable` made a null type, and for an answer every `oneOf` an `anyOf`."""
    if isinstance(schema, list):
        return [json_schema(item, answer=answer) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {
        ("anyOf" if answer and key == "oneOf" else key): json_schema(value, answer=answer)
        for key, value in schema.items()
        if key != "nullable"
    }
    if schema.get("nullable") is True:
        converted = _nullable(converted)
    return converted


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if isinstance(kind := schema.get("type"), str):
        schema["type"] = [kind, "null"]
    elif "type" not in schema:
        return {"anyOf": [schema, {"type": "null"}]}
    if isinstance(schema.get("enum"), list) and None not in schema["enum"]:
        schema["enum"] = [*schema["enum"], None]
    return schema
