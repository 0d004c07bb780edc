"""TypeScript for tools: a method declaration per tool from its JSON Schemas, and the declarations of a
whole set of bindings. Schemas come from upstreams and are untrusted: descriptions go into doc comments
with `*/` broken up, property names that are not identifiers are quoted, and nesting is bounded."""

import json
import re
from typing import Any

from handoff.codemode.bindings import IDENTIFIER, Binding

MAX_DEPTH = 6  # deeper schemas are typed `unknown` below this level
MAX_DOC_CHARS = 400
CACHE_SIZE = 20_000
PRIMITIVES = {"string": "string", "number": "number", "integer": "number", "boolean": "boolean", "null": "null"}
PRELUDE = """\
/** A tool call that failed: an upstream's error, or a refusal by the gateway's policy. */
declare class MCPToolError extends Error {
  /** The exposed name of the tool that failed. */
  readonly tool: string;
  /** A stable code, such as POLICY_DENIED, UPSTREAM_TIMEOUT or TOOL_ERROR. */
  readonly code: string;
}
"""


def doc_comment(text: str, indent: str) -> list[str]:
    text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", text or "").strip().replace("*/", "*\\/")
    if not text:
        return []
    text = text if len(text) <= MAX_DOC_CHARS else text[: MAX_DOC_CHARS - 1] + "…"
    lines = text.splitlines()
    if len(lines) == 1:
        return [f"{indent}/** {lines[0]} */"]
    return [f"{indent}/**", *(f"{indent} * {line}".rstrip() for line in lines), f"{indent} */"]


def _key(name: str) -> str:
    return name if IDENTIFIER.fullmatch(name) else json.dumps(name)


def _grouped(member: str) -> str:
    """A union or intersection inside an array or another combination needs parentheses."""
    return f"({member})" if " | " in member or " & " in member else member


class _Writer:
    def __init__(self, root: dict[str, Any]) -> None:
        self.definitions = {**root.get("definitions", {}), **root.get("$defs", {})}

    def type_of(self, schema: Any, depth: int, indent: str) -> str:
        if schema is False:
            return "never"
        if not isinstance(schema, dict) or depth > MAX_DEPTH:
            return "unknown"
        kind = self._kind(schema, depth, indent)
        return f"{kind} | null" if schema.get("nullable") is True and kind not in ("unknown", "null") else kind

    def _kind(self, schema: dict[str, Any], depth: int, indent: str) -> str:
        if isinstance(ref := schema.get("$ref"), str):
            target = self.definitions.get(ref.rpartition("/")[2]) if ref.startswith("#/") else None
            return self.type_of(target, depth + 1, indent)
        if "const" in schema:
            return _literal(schema["const"])
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return " | ".join(dict.fromkeys(_literal(value) for value in schema["enum"]))
        for combinator, joiner in (("anyOf", " | "), ("oneOf", " | "), ("allOf", " & ")):
            if isinstance(members := schema.get(combinator), list) and members:
                types = dict.fromkeys(_grouped(self.type_of(m, depth + 1, indent)) for m in members)
                return joiner.join(types)
        kinds = schema.get("type")
        if isinstance(kinds, list):
            return " | ".join(dict.fromkeys(self._single(schema, k, depth, indent) for k in kinds)) or "unknown"
        if kinds is None and "properties" in schema:
            kinds = "object"
        return self._single(schema, kinds, depth, indent)

    def _single(self, schema: dict[str, Any], kind: Any, depth: int, indent: str) -> str:
        if kind in PRIMITIVES:
            return PRIMITIVES[kind]
        if kind == "array":
            return f"{_grouped(self.type_of(schema.get('items', {}), depth + 1, indent))}[]"
        if kind == "object":
            return self.object_of(schema, depth, indent)
        return "unknown"

    def object_of(self, schema: dict[str, Any], depth: int, indent: str) -> str:
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        extra = schema.get("additionalProperties", True)
        extra_type = "unknown" if extra is True or extra is None else self.type_of(extra, depth + 1, indent)
        if not properties:
            return f"Record<string, {extra_type}>" if extra is not False else "Record<string, never>"
        required = set(schema.get("required") or [])
        inner = indent + "  "
        lines = ["{"]
        for name, sub in properties.items():
            lines += doc_comment(sub.get("description", "") if isinstance(sub, dict) else "", inner)
            optional = "" if name in required else "?"
            lines.append(f"{inner}{_key(name)}{optional}: {self.type_of(sub, depth + 1, inner)};")
        if extra is not False and schema.get("additionalProperties") is not None:
            lines.append(f"{inner}[key: string]: {extra_type};")
        return "\n".join([*lines, f"{indent}}}"])


def _literal(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str | int | float | bool) or value is None else "unknown"


def input_type(schema: Any, indent: str = "") -> str:
    return _Writer(schema if isinstance(schema, dict) else {}).type_of(schema or {"type": "object"}, 0, indent)


_signatures: dict[tuple[str, str], str] = {}


def method_declaration(method: str, definition: dict[str, Any], digest: str, indent: str = "") -> str:
    """`/** description */ name(args: {...}): Promise<...>;`, cached per definition hash and method."""
    key = (digest, method, indent)
    if key not in _signatures:
        if len(_signatures) >= CACHE_SIZE:
            _signatures.clear()
        _signatures[key] = _declare(method, definition, indent)
    return _signatures[key]


def _declare(method: str, definition: dict[str, Any], indent: str) -> str:
    schema = definition.get("inputSchema") if isinstance(definition.get("inputSchema"), dict) else {}
    optional = "" if schema.get("required") else "?"
    output = definition.get("outputSchema")
    result = input_type(output, indent) if isinstance(output, dict) else "unknown"
    lines = doc_comment(definition.get("description") or definition.get("title") or "", indent)
    return "\n".join([*lines, f"{indent}{method}(args{optional}: {input_type(schema, indent)}): Promise<{result}>;"])


def declarations(entries: list[tuple[Binding, dict[str, Any], str]]) -> str:
    """The `.d.ts` of bindings: `declare const tools`, one interface per namespace, MCPToolError."""
    namespaces: dict[str, list[str]] = {}
    for binding, definition, digest in sorted(entries, key=lambda e: (e[0].namespace, e[0].method)):
        declaration = method_declaration(binding.method, definition, digest, "  ")
        namespaces.setdefault(binding.namespace, []).append(declaration)
    parts = [PRELUDE]
    for namespace, methods in namespaces.items():
        parts.append("\n".join([f"interface {_interface(namespace)} {{", *methods, "}"]) + "\n")
    members = "".join(f"  readonly {namespace}: {_interface(namespace)};\n" for namespace in namespaces)
    parts.append(f"declare const tools: {{\n{members}}};\n")
    return "\n".join(parts)


def _interface(namespace: str) -> str:
    return f"{namespace[0].upper()}{namespace[1:]}Tools"
