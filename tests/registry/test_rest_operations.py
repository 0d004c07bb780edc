"""A REST service's operations as MCP tools (registry/rest/operations.py): names, input and output schemas, the
selection by tag, id and method, and hand-declared operations with their refusals."""

import functools
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from django.core.management import call_command
from jsonschema import Draft202012Validator
from mcp import types

from registry.rest.document import DocumentRefused, document_load
from registry.rest.operations import Operation, operations_declared, operations_of, tool_of

OK = {"200": {"description": "ok"}}


def a_document(paths: dict[str, Any]) -> dict[str, Any]:
    return {"openapi": "3.1.0", "info": {"title": "Shop", "version": "1"}, "paths": paths}


def an_operation(operation_id: str | None = None, **more: Any) -> dict[str, Any]:
    return ({"operationId": operation_id} if operation_id else {}) | {"responses": OK} | more


def json_answer(schema: dict[str, Any]) -> dict[str, Any]:
    return {"200": {"description": "ok", "content": {"application/json": {"schema": schema}}}}


def only(document: dict[str, Any], **options: Any) -> Operation:
    [operation] = operations_of(document, max_name_length=64, **options)
    return operation


def names(document: dict[str, Any], **options: Any) -> list[str]:
    return [op.name for op in operations_of(document, max_name_length=64, **options)]


def refusal(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(DocumentRefused) as refused:
        call(*args, **kwargs)
    return str(refused.value)


# --- Names ----------------------------------------------------------------------------------------------------


def test_every_operation_of_the_gateways_own_document_becomes_a_valid_mcp_tool(tmp_path: Path):
    schema = tmp_path / "schema.yaml"
    call_command("spectacular", "--file", str(schema))
    options = {"document_url": None, "fetch": None, "internal": False}
    document = anyio.run(functools.partial(document_load, schema.read_bytes(), **options))
    operations = operations_of(document, max_name_length=64)
    assert len(operations) == sum(
        len(set(item) & {"get", "post", "put", "patch", "delete"}) for item in document["paths"].values()
    )
    tools = {op.name: types.Tool.model_validate(tool_of(op)) for op in operations}
    agents = tools["agents_list"]
    assert agents.output_schema["properties"]["result"]["type"] == "array", "an array answer, wrapped"
    assert agents.annotations.read_only_hint is True


def test_an_operation_without_an_operation_id_is_named_from_its_method_and_path():
    document = a_document({"/stores/{storeId}/items": {"get": an_operation()}})
    assert names(document) == ["get_stores_by_storeId_items"]


def test_an_operation_id_outside_the_tool_name_alphabet_is_made_to_fit():
    assert names(a_document({"/a": {"get": an_operation("list items (v2)")}})) == ["list_items_v2"]
    assert names(a_document({"/a": {"get": an_operation("constructor")}})) == ["constructor_"]


def test_a_long_name_is_cut_to_the_length_left_with_a_stable_hash_of_the_whole():
    document = a_document(
        {
            "/a": {"get": an_operation("items_list_every_item_of_the_store_a")},
            "/b": {"get": an_operation("items_list_every_item_of_the_store_b")},
        }
    )
    first, second = (op.name for op in operations_of(document, max_name_length=24))
    assert len(first) == len(second) == 24
    assert first.startswith("items_list_ever") and first[15] == "_" and first != second
    assert first == operations_of(document, max_name_length=24)[0].name, "the same name every time"


def test_two_operations_with_one_tool_name_refuse_the_document_naming_both():
    document = a_document({"/one": {"get": an_operation("items list")}, "/two": {"post": an_operation("items_list")}})
    assert refusal(operations_of, document, max_name_length=64) == (
        "GET /one (operationId 'items list') and POST /two (operationId 'items_list') are both named 'items_list' "
        "as tools; give one another operationId or exclude one"
    )
    assert names(document, exclude_ids=("items list",)) == ["items_list"], "excluding one settles it"


def test_a_path_that_climbs_out_of_the_base_url_refuses_the_document():
    document = a_document({"/files/../admin": {"get": an_operation("admin")}})
    assert refusal(operations_of, document, max_name_length=64) == (
        "the path '/files/../admin' must start with / and have no . or .. segment"
    )


# --- Selection ------------------------------------------------------------------------------------------------


def a_shop() -> dict[str, Any]:
    return a_document(
        {
            "/items": {
                "get": an_operation("items_list", tags=["items"]),
                "post": an_operation("item_create", tags=["items"]),
                "head": an_operation("items_head", tags=["items"]),
            },
            "/orders": {"get": an_operation("orders_list", tags=["orders"]), "delete": an_operation("orders_purge")},
        }
    )


def test_read_only_keeps_get_and_head_operations_only():
    assert names(a_shop(), read_only=True) == ["items_list", "items_head", "orders_list"]


def test_operations_are_included_by_tag_or_id_and_an_exclusion_wins():
    assert names(a_shop(), include_tags=("orders",)) == ["orders_list"]
    assert names(a_shop(), include_tags=("orders",), include_ids=("item_create",)) == ["item_create", "orders_list"]
    assert names(a_shop(), include_tags=("items",), exclude_ids=("item_create",)) == ["items_list", "items_head"]
    assert names(a_shop(), exclude_tags=("items",)) == ["orders_list", "orders_purge"]


# --- Schemas --------------------------------------------------------------------------------------------------


def test_path_query_and_header_parameters_are_arguments_and_the_json_body_is_the_argument_body():
    body = {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}
    parameters = [
        {"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}},
        {"name": "id", "in": "query", "schema": {"type": "string"}, "description": "Another id"},
        {"name": "X-Trace", "in": "header", "schema": {"type": "string"}},
        {"name": "Authorization", "in": "header", "schema": {"type": "string"}},
        {"name": "session", "in": "cookie", "schema": {"type": "string"}},
    ]
    document = a_document({"/items/{id}": {"put": an_operation("item_put", parameters=parameters, requestBody=body)}})
    op = only(document)
    assert tool_of(op)["inputSchema"] == {
        "type": "object",
        "properties": {
            "path_id": {"type": "integer"},
            "query_id": {"type": "string", "description": "Another id"},
            "X-Trace": {"type": "string"},
            "body": {"type": "object"},
        },
        "required": ["path_id", "body"],
    }
    assert [(p.argument, p.name, p.location) for p in op.parameters] == [
        ("path_id", "id", "path"),
        ("query_id", "id", "query"),
        ("X-Trace", "X-Trace", "header"),
    ]


def test_a_path_items_parameter_applies_to_each_operation_unless_the_operation_redefines_it():
    shared = [{"name": "limit", "in": "query", "schema": {"type": "integer"}}]
    own = [{"name": "limit", "in": "query", "required": True, "schema": {"type": "integer", "maximum": 10}}]
    document = a_document(
        {"/items": {"parameters": shared, "get": an_operation("a"), "post": an_operation("b", parameters=own)}}
    )
    first, second = operations_of(document, max_name_length=64)
    assert tool_of(first)["inputSchema"]["required"] == []
    assert tool_of(second)["inputSchema"]["properties"]["limit"] == {"type": "integer", "maximum": 10}


def test_a_body_that_is_not_json_is_not_offered_as_an_argument():
    form = {"content": {"application/x-www-form-urlencoded": {"schema": {"type": "object"}}}}
    op = only(a_document({"/login": {"post": an_operation("login", requestBody=form)}}))
    assert op.body_schema is None and "body" not in tool_of(op)["inputSchema"]["properties"]


def test_an_object_answer_is_the_output_schema_as_is_and_an_array_is_wrapped():
    item = {"type": "object", "properties": {"id": {"type": "integer"}}}
    as_is = only(a_document({"/item": {"get": an_operation("item", responses=json_answer(item))}}))
    assert tool_of(as_is)["outputSchema"] == item and not as_is.output_wrapped
    listed = only(
        a_document({"/items": {"get": an_operation("items", responses=json_answer({"type": "array", "items": item}))}})
    )
    assert tool_of(listed)["outputSchema"] == {
        "type": "object",
        "properties": {"result": {"type": "array", "items": item}},
        "required": ["result"],
    }


def test_an_answer_that_is_not_json_has_no_output_schema_but_its_media_type_is_kept():
    xml = {"200": {"description": "ok", "content": {"application/xml": {"schema": {"type": "object"}}}}}
    op = only(a_document({"/feed": {"get": an_operation("feed", responses=xml)}}))
    assert op.answer_media_type == "application/xml" and "outputSchema" not in tool_of(op)


def test_the_description_is_the_summary_then_the_description_or_else_the_method_and_path():
    described = an_operation("a", summary="List items.", description="Newest first.", deprecated=True)
    assert tool_of(only(a_document({"/a": {"get": described}})))["description"] == (
        "List items.\n\nNewest first.\n\nDeprecated."
    )
    assert tool_of(only(a_document({"/b": {"get": an_operation("b")}})))["description"] == "GET /b"


# --- Declared by hand -----------------------------------------------------------------------------------------


def an_item_get(**more: Any) -> dict[str, Any]:
    return {
        "name": "item_get",
        "method": "get",
        "path": "/items/{id}",
        "description": "One item.",
        "parameters": {
            "type": "object",
            "properties": {"id": {"type": "string"}, "expand": {"type": "boolean"}, "X-Trace": {"type": "string"}},
        },
        "in": {"X-Trace": "header"},
    } | more


def test_a_declared_operation_puts_path_names_in_the_path_headers_where_told_and_the_rest_in_the_query():
    [op] = operations_declared([an_item_get(body={"type": "object"}, output={"type": "array"})], max_name_length=64)
    assert (op.method, op.path) == ("GET", "/items/{id}")
    assert [(p.name, p.location, p.required) for p in op.parameters] == [
        ("id", "path", True),
        ("expand", "query", False),
        ("X-Trace", "header", False),
    ]
    tool = tool_of(op)
    assert tool["inputSchema"]["required"] == ["id", "body"]
    assert tool["outputSchema"]["properties"]["result"] == {"type": "array"}
    types.Tool.model_validate(tool)


ITEM = "declared operation 1 (item_get): "
WHERE = "path is for the path's {names}"


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (an_item_get(verb="GET"), "declared operation 1 has unknown keys: verb"),
        (an_item_get(name="item get"), "declared operation 1 needs a name of 1-64 characters of A-Z a-z 0-9 _ . -"),
        (an_item_get(name="__proto__"), "declared operation 1 is named '__proto__', which is reserved"),
        (
            an_item_get(method="FETCH"),
            "declared operation 1 needs a method, one of GET, PUT, POST, DELETE, OPTIONS, HEAD, PATCH, TRACE",
        ),
        (an_item_get(path=None), "declared operation 1 (item_get) needs a path such as /items/{id}"),
        (
            an_item_get(path="/items/../{id}"),
            f"{ITEM}the path '/items/../{{id}}' must start with / and have no . or .. segment",
        ),
        (
            an_item_get(path="/stores/{store}/items/{id}"),
            f"{ITEM}the path names store, which parameters does not declare",
        ),
        (an_item_get(**{"in": {"expand": "path"}}), f"{ITEM}parameter 'expand' cannot go in 'path': {WHERE}"),
        (an_item_get(**{"in": {"expand": "cookie"}}), f"{ITEM}parameter 'expand' cannot go in 'cookie': {WHERE}"),
        (
            an_item_get(**{"in": {"other": "query"}}),
            f"{ITEM}'in' must map declared parameters to path, query or header",
        ),
        (
            an_item_get(body={"type": "thing"}),
            f"{ITEM}body is not a valid JSON Schema: 'thing' is not valid under any of the given schemas",
        ),
        (an_item_get(body=[]), f"{ITEM}body must be a JSON Schema object"),
    ],
)
def test_a_malformed_declared_operation_is_refused_naming_it_and_the_fault(item: dict[str, Any], message: str):
    assert refusal(operations_declared, [item], max_name_length=64) == message


def test_declared_operations_with_one_name_or_none_at_all_are_refused():
    assert refusal(operations_declared, [an_item_get(), an_item_get(method="DELETE")], max_name_length=64) == (
        "GET /items/{id} and DELETE /items/{id} are both named 'item_get' as tools; rename one"
    )
    assert refusal(operations_declared, [], max_name_length=64) == "declared operations must be a non-empty list"


def test_a_declared_parameter_named_body_clashes_with_a_declared_body():
    item = an_item_get(parameters={"type": "object", "properties": {"id": {}, "body": {}}}, body={}, **{"in": {}})
    assert refusal(operations_declared, [item], max_name_length=64) == (
        "declared operation 1 (item_get): a parameter named 'body' clashes with the declared body"
    )
    assert json.dumps(tool_of(operations_declared([an_item_get()], max_name_length=64)[0]))


def test_an_answers_schema_allows_a_null_that_openapi_3_0_allows_and_overlapping_branches():
    document = {
        "openapi": "3.0.3",
        "info": {"title": "t", "version": "1"},
        "paths": {
            "/thing": {
                "get": {
                    "operationId": "thing",
                    "parameters": [{"name": "q", "in": "query", "schema": {"type": "string", "nullable": True}}],
                    "responses": {
                        "200": {
                            "description": "ok",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {
                                            "url": {"oneOf": [{"type": "string", "format": "uri"}, {"maxLength": 0}]},
                                            "note": {"type": "string", "enum": ["a"], "nullable": True},
                                        },
                                    }
                                }
                            },
                        }
                    },
                }
            }
        },
    }
    tool = tool_of(operations_of(document, max_name_length=64)[0])
    answer = {"url": "", "note": None}
    Draft202012Validator(tool["outputSchema"]).validate(answer)  # both would fail against the document as written
    assert tool["outputSchema"]["properties"]["note"] == {"type": ["string", "null"], "enum": ["a", None]}
    assert tool["inputSchema"]["properties"]["q"] == {"type": ["string", "null"]}
