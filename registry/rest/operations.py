"""A REST service's operations, and each as an MCP tool. From a resolved OpenAPI document (operations_of) or from
hand-declared operations (operations_declared), both giving the same Operation; tool_of turns one into an MCP
Tool as a plain dict.

A tool's arguments are its operation's path, query and header parameters, each a property of the input schema
under the parameter's own name (`{location}_{name}` when two locations share a name, or a parameter is named
`body`), and the JSON request body whole under the property `body`: never flattened, so that a body that is an
array, a `oneOf` or has a property named like a parameter needs no special case. Which argument goes where is
kept in Operation.parameters, not in the schema."""

import hashlib
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import SchemaError
from jsonschema.validators import Draft202012Validator

from policy.manifest import RESERVED_NAMES
from registry.rest.document import DocumentRefused
from registry.rest.schemas import json_schema

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
READ_ONLY_METHODS = frozenset({"GET", "HEAD"})
LOCATIONS = ("path", "query", "header")
# OpenAPI says these header parameters are ignored: the HTTP client sets them.
IGNORED_HEADERS = frozenset({"accept", "content-type", "authorization"})
BODY = "body"
UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+", re.ASCII)
TEMPLATE_VARIABLE = re.compile(r"\{([^{}]+)\}")
HASH_CHARS = 8


@dataclass(frozen=True)
class Parameter:
    argument: str  # the property of the tool's input schema
    name: str  # the name in the HTTP request
    location: str  # path, query or header
    required: bool
    schema: dict[str, Any]
    explode: bool = True  # an array in the query as `a=1&a=2` (OpenAPI's default), else `a=1,2`


@dataclass(frozen=True)
class Operation:
    name: str
    method: str  # upper case
    path: str  # the template, `/items/{id}`, appended to the base URL
    summary: str = ""
    description: str = ""
    parameters: tuple[Parameter, ...] = ()
    body_schema: dict[str, Any] | None = None  # None: the operation takes no JSON body
    body_required: bool = False
    answer_media_type: str | None = None  # of the 2xx answer, as documented
    output_schema: dict[str, Any] | None = None  # the JSON answer's schema, as documented
    output_wrapped: bool = False  # structuredContent is {"result": answer}: the schema is not an object's
    tags: tuple[str, ...] = ()
    operation_id: str | None = None
    deprecated: bool = False

    @property
    def label(self) -> str:
        """The operation as an operator knows it: `GET /items/{id} (operationId 'item_get')`."""
        named = f" (operationId {self.operation_id!r})" if self.operation_id else ""
        return f"{self.method} {self.path}{named}"


# --- From an OpenAPI document ---------------------------------------------------------------------------------


def operations_of(
    document: dict[str, Any],
    *,
    include_tags: tuple[str, ...] = (),
    exclude_tags: tuple[str, ...] = (),
    include_ids: tuple[str, ...] = (),
    exclude_ids: tuple[str, ...] = (),
    read_only: bool = False,
    max_name_length: int,
) -> list[Operation]:
    """The operations of a resolved document (document_load's) that are chosen: with any include list given,
    those matching one of them (a tag, or an operationId or tool name); never an excluded one; GET and HEAD
    only when read_only. Two chosen operations with one tool name refuse the document."""
    found = []
    for path, item in (document.get("paths") or {}).items():
        for method in METHODS:
            if isinstance(item.get(method), dict):
                found.append(_operation(path, method, item, max_name_length=max_name_length))
    tags, ids = (set(include_tags), set(exclude_tags)), (set(include_ids), set(exclude_ids))
    chosen = [op for op in found if _chosen(op, tags, ids) and (not read_only or op.method in READ_ONLY_METHODS)]
    _refuse_collisions(chosen, fix="give one another operationId or exclude one")
    return chosen


def _chosen(op: Operation, tags: tuple[set[str], set[str]], ids: tuple[set[str], set[str]]) -> bool:
    """`tags` and `ids` are each (included, excluded); an id is an operationId or a tool name."""
    own_tags, own_ids = set(op.tags), {op.name, op.operation_id}
    if own_tags & tags[1] or own_ids & ids[1]:
        return False
    return (not tags[0] and not ids[0]) or bool(own_tags & tags[0] or own_ids & ids[0])


def _refuse_collisions(operations: list[Operation], *, fix: str) -> None:
    seen: dict[str, Operation] = {}
    for op in operations:
        if op.name in seen:
            raise DocumentRefused(f"{seen[op.name].label} and {op.label} are both named {op.name!r} as tools; {fix}")
        seen[op.name] = op


def _operation(path: str, method: str, item: dict[str, Any], *, max_name_length: int) -> Operation:
    spec = item[method]
    _refuse_dot_segments(path)
    operation_id = spec.get("operationId") if isinstance(spec.get("operationId"), str) else None
    body_schema, body_required = _body(spec.get("requestBody"))
    media, output = _answer(spec.get("responses") or {})
    parameters = _parameters(item.get("parameters") or [], spec.get("parameters") or [], body_schema is not None)
    return Operation(
        name=_tool_name(operation_id or _derived_name(method, path), max_name_length),
        method=method.upper(),
        path=path,
        summary=str(spec.get("summary") or ""),
        description=str(spec.get("description") or ""),
        parameters=parameters,
        body_schema=body_schema,
        body_required=body_required,
        answer_media_type=media,
        output_schema=output,
        output_wrapped=output is not None and not _is_object_schema(output),
        tags=tuple(str(tag) for tag in spec.get("tags") or ()),
        operation_id=operation_id,
        deprecated=bool(spec.get("deprecated")),
    )


def _refuse_dot_segments(path: str) -> None:
    # A path template is the document's own text: one that climbs out of the base URL is refused here.
    if not path.startswith("/") or {".", ".."} & set(path.split("/")):
        raise DocumentRefused(f"the path {path!r} must start with / and have no . or .. segment")


def _derived_name(method: str, path: str) -> str:
    """`get_items_by_id` for GET /items/{id}: stable while the method and path stay."""
    words = [method.lower()]
    for segment in filter(None, path.split("/")):
        variable = TEMPLATE_VARIABLE.fullmatch(segment)
        words += ["by", variable[1]] if variable else [segment]
    return "_".join(words)


def _tool_name(wanted: str, max_length: int) -> str:
    """`wanted` in the tool-name alphabet; cut to max_length with a hash of the whole when longer."""
    name = UNSAFE_NAME.sub("_", wanted).strip("_") or "operation"
    if name in RESERVED_NAMES:  # `constructor`, `toString`: keys a JavaScript client would trip on
        name = f"{name}_"
    if len(name) <= max_length:
        return name
    digest = hashlib.sha256(wanted.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
    return f"{name[: max_length - HASH_CHARS - 1]}_{digest}"


def _parameters(shared: list[dict[str, Any]], own: list[dict[str, Any]], has_body: bool) -> tuple[Parameter, ...]:
    # An operation's parameter replaces its path item's of the same name and location (OpenAPI's rule).
    merged = {(p.get("name"), p.get("in")): p for p in [*shared, *own] if isinstance(p, dict)}
    kept = [
        p
        for (name, location), p in merged.items()
        if location in LOCATIONS and not (location == "header" and str(name).lower() in IGNORED_HEADERS)
    ]
    names = Counter(str(p["name"]) for p in kept) + Counter([BODY] if has_body else [])
    return tuple(_parameter(p, clash=names[str(p["name"])] > 1) for p in kept)


def _parameter(spec: dict[str, Any], *, clash: bool) -> Parameter:
    name, location = str(spec["name"]), spec["in"]
    schema = dict(spec.get("schema") or _content_schema(spec.get("content")) or {})
    if spec.get("description") and "description" not in schema:
        schema["description"] = str(spec["description"])
    return Parameter(
        argument=f"{location}_{name}" if clash else name,
        name=name,
        location=location,
        required=bool(spec.get("required")) or location == "path",
        schema=schema,
        explode=bool(spec.get("explode", spec.get("style", "form") == "form")),
    )


def _content_schema(content: Any) -> dict[str, Any] | None:
    if not isinstance(content, dict) or not content:
        return None
    media = next(iter(content.values()))
    return media.get("schema") if isinstance(media, dict) else None


def _body(spec: Any) -> tuple[dict[str, Any] | None, bool]:
    """The JSON body's schema and whether it is required. A body of another media type only (a form, a file)
    is not offered: the tool takes no body, and the service answers if it needed one."""
    if not isinstance(spec, dict):
        return None, False
    media = _json_media(spec.get("content") or {})
    if media is None:
        return None, False
    return dict((spec["content"][media] or {}).get("schema") or {}), bool(spec.get("required"))


def _json_media(content: dict[str, Any]) -> str | None:
    return next((media for media in content if is_json(media)), None)


def is_json(media: str) -> bool:
    kind = media.split(";")[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def _answer(responses: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    """The media type of the first documented 2xx answer, and its schema when that is JSON."""
    codes = sorted(code for code in responses if str(code).startswith("2"))
    for code in codes:
        content = (responses[code] or {}).get("content") or {}
        if json_media := _json_media(content):
            schema = (content[json_media] or {}).get("schema")
            return json_media, dict(schema) if isinstance(schema, dict) and schema else None
        if content:
            return next(iter(content)), None
    return None, None


def _is_object_schema(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "object" or schema.get("type") == ["object"]


# --- As an MCP tool -------------------------------------------------------------------------------------------


def tool_of(op: Operation) -> dict[str, Any]:
    """The operation as an MCP Tool (a plain dict): its arguments per the module's docstring, and an output
    schema when the documented answer is JSON with a schema, wrapped as {"result": ...} unless an object's."""
    tool: dict[str, Any] = {
        "name": op.name,
        "description": _description(op),
        "inputSchema": _input_schema(op),
        "annotations": {"readOnlyHint": op.method in READ_ONLY_METHODS},
    }
    if op.output_schema is not None:
        tool["outputSchema"] = _output_schema(op)
    return tool


def _description(op: Operation) -> str:
    parts = [text.strip() for text in (op.summary, op.description) if text.strip()]
    if op.deprecated:
        parts.append("Deprecated.")
    return "\n\n".join(parts) or f"{op.method} {op.path}"


def _input_schema(op: Operation) -> dict[str, Any]:
    properties = {p.argument: p.schema for p in op.parameters}
    required = [p.argument for p in op.parameters if p.required]
    if op.body_schema is not None:
        properties[BODY] = op.body_schema
        if op.body_required:
            required.append(BODY)
    return json_schema({"type": "object", "properties": properties, "required": required})


def _output_schema(op: Operation) -> dict[str, Any]:
    if not op.output_wrapped:
        return json_schema(op.output_schema or {"type": "object"}, answer=True)
    wrapped = {"type": "object", "properties": {"result": op.output_schema}, "required": ["result"]}
    return json_schema(wrapped, answer=True)


# --- Declared by hand -----------------------------------------------------------------------------------------

DECLARED_KEYS = frozenset({"name", "method", "path", "description", "parameters", "in", "body", "body_required"})
DECLARED_KEYS |= {"output"}


def operations_declared(items: list[dict[str, Any]], *, max_name_length: int) -> list[Operation]:
    """Operations declared by hand, for a service without a document. Each item:

        {"name": "item_get",                      # the tool name: A-Z a-z 0-9 _ . - , at most max_name_length
         "method": "GET",                         # GET PUT POST DELETE OPTIONS HEAD PATCH TRACE
         "path": "/items/{id}",                   # appended to the upstream's base URL
         "description": "One item, by id.",       # optional
         "parameters": {"type": "object",         # optional: a JSON Schema object, one property per parameter
                        "properties": {"id": {"type": "string"}, "X-Trace": {"type": "string"}},
                        "required": ["id"]},
         "in": {"X-Trace": "header"},             # optional: path, query or header; path for {id} in the path,
                                                  # query for any other property not named here
         "body": {"type": "object"},              # optional: the JSON body's schema, the argument `body`
         "body_required": true,                   # optional, true when a body is declared
         "output": {"type": "object"}}            # optional: the JSON answer's schema

    Refused (DocumentRefused, naming the item) when malformed; two items with one name are refused."""
    if not isinstance(items, list) or not items:
        raise DocumentRefused("declared operations must be a non-empty list")
    operations = [_declared(item, index, max_name_length) for index, item in enumerate(items)]
    _refuse_collisions(operations, fix="rename one")
    return operations


def _declared(item: Any, index: int, max_name_length: int) -> Operation:
    where = f"declared operation {index + 1}"
    if not isinstance(item, dict):
        raise DocumentRefused(f"{where} is not a mapping")
    if unknown := sorted(set(item) - DECLARED_KEYS):
        raise DocumentRefused(f"{where} has unknown keys: {', '.join(unknown)}")
    name, method, path = _declared_name(item, where, max_name_length), _declared_method(item, where), item.get("path")
    if not isinstance(path, str):
        raise DocumentRefused(f"{where} ({name}) needs a path such as /items/{{id}}")
    try:
        _refuse_dot_segments(path)
        return _declared_operation(item, name=name, method=method, path=path)
    except DocumentRefused as refused:
        raise DocumentRefused(f"{where} ({name}): {refused}") from None


def _declared_name(item: dict[str, Any], where: str, max_length: int) -> str:
    name = item.get("name")
    if not isinstance(name, str) or UNSAFE_NAME.search(name) or not 0 < len(name) <= max_length:
        raise DocumentRefused(f"{where} needs a name of 1-{max_length} characters of A-Z a-z 0-9 _ . -")
    if name in RESERVED_NAMES:
        raise DocumentRefused(f"{where} is named {name!r}, which is reserved")
    return name


def _declared_method(item: dict[str, Any], where: str) -> str:
    method = item.get("method")
    if not isinstance(method, str) or method.lower() not in METHODS:
        raise DocumentRefused(f"{where} needs a method, one of {', '.join(m.upper() for m in METHODS)}")
    return method.upper()


def _declared_operation(item: dict[str, Any], *, name: str, method: str, path: str) -> Operation:
    body = _declared_schema(item.get("body"), "body") if "body" in item else None
    output = _declared_schema(item.get("output"), "output") if "output" in item else None
    return Operation(
        name=name,
        method=method,
        path=path,
        description=str(item.get("description") or ""),
        parameters=_declared_parameters(item, path, has_body=body is not None),
        body_schema=body,
        body_required=body is not None and bool(item.get("body_required", True)),
        answer_media_type="application/json" if output is not None else None,
        output_schema=output,
        output_wrapped=output is not None and not _is_object_schema(output),
    )


def _declared_schema(schema: Any, key: str) -> dict[str, Any]:
    if not isinstance(schema, dict):
        raise DocumentRefused(f"{key} must be a JSON Schema object")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise DocumentRefused(f"{key} is not a valid JSON Schema: {exc.message}") from None
    return schema


def _declared_parameters(item: dict[str, Any], path: str, *, has_body: bool) -> tuple[Parameter, ...]:
    schema = _declared_schema(item.get("parameters", {"type": "object"}), "parameters")
    properties, locations = schema.get("properties") or {}, item.get("in") or {}
    in_path = set(TEMPLATE_VARIABLE.findall(path))
    _check_locations(properties, locations, in_path, has_body)
    required = set(schema.get("required") or ()) | in_path
    return tuple(
        Parameter(
            argument=name,
            name=name,
            location="path" if name in in_path else locations.get(name, "query"),
            required=name in required,
            schema=dict(prop) if isinstance(prop, dict) else {},
        )
        for name, prop in properties.items()
    )


def _check_locations(properties: dict[str, Any], locations: Any, in_path: set[str], has_body: bool) -> None:
    if missing := sorted(in_path - set(properties)):
        raise DocumentRefused(f"the path names {', '.join(missing)}, which parameters does not declare")
    if not isinstance(locations, dict) or set(locations) - set(properties):
        raise DocumentRefused("'in' must map declared parameters to path, query or header")
    for name, location in locations.items():
        if location not in LOCATIONS or (location == "path") != (name in in_path):
            raise DocumentRefused(f"parameter {name!r} cannot go in {location!r}: path is for the path's {{names}}")
    if has_body and BODY in properties:
        raise DocumentRefused("a parameter named 'body' clashes with the declared body")
