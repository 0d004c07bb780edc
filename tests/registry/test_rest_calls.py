"""A REST tool call as an HTTP request and its answer as a CallToolResult (registry/rest/calls.py): a path
parameter never reaches another path, a header never carries a line break, and each kind of answer renders."""

from typing import Any

import pytest
from mcp import types

from registry.rest.calls import CallRefused, request_of, result_of
from registry.rest.operations import Operation, operations_declared

BASE = "https://api.example.com/v1"


def declared(**item: Any) -> Operation:
    [op] = operations_declared([{"name": "call", "method": "GET", "path": "/items/{id}"} | item], max_name_length=64)
    return op


def an_item_get(**more: Any) -> Operation:
    properties = {"id": {"type": "string"}, "expand": {}, "tag": {}, "X-Trace": {"type": "string"}}
    return declared(parameters={"type": "object", "properties": properties}, **{"in": {"X-Trace": "header"}}, **more)


def refusal(op: Operation, arguments: dict[str, Any]) -> str:
    with pytest.raises(CallRefused) as refused:
        request_of(op, arguments, base_url=BASE)
    return str(refused.value)


# --- The request ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ("../admin", "/v1/items/..%2Fadmin"),
        ("..", "/v1/items/%2E%2E"),
        (".", "/v1/items/%2E"),
        ("%2F", "/v1/items/%252F"),
        ("a/b", "/v1/items/a%2Fb"),
        ("a\r\nSet-Cookie: x", "/v1/items/a%0D%0ASet-Cookie%3A%20x"),
        ("?q=1#top", "/v1/items/%3Fq%3D1%23top"),
        ("ünï", "/v1/items/%C3%BCn%C3%AF"),
        (42, "/v1/items/42"),
    ],
)
def test_a_path_parameter_is_one_segment_whatever_it_holds(value: Any, path: str):
    _, url, _, _ = request_of(an_item_get(), {"id": value}, base_url=BASE)
    assert url == f"https://api.example.com{path}"


def test_two_parameters_that_together_make_dot_dot_do_not_climb():
    op = declared(path="/files/{a}{b}", parameters={"type": "object", "properties": {"a": {}, "b": {}}})
    assert request_of(op, {"a": ".", "b": "."}, base_url=BASE)[1] == "https://api.example.com/v1/files/%2E%2E"


def test_query_parameters_are_encoded_with_arrays_repeated_and_null_ones_left_out():
    arguments = {"id": "7", "expand": True, "tag": ["a b", "c&d"], "X-Trace": None}
    method, url, headers, body = request_of(an_item_get(), arguments, base_url=BASE + "/?key=k")
    assert (method, headers, body) == ("GET", {}, None)
    assert url == "https://api.example.com/v1/items/7?key=k&expand=true&tag=a%20b&tag=c%26d"


def test_header_parameters_are_sent_and_one_with_a_line_break_is_refused():
    assert request_of(an_item_get(), {"id": "7", "X-Trace": "abc"}, base_url=BASE)[2] == {"X-Trace": "abc"}
    assert refusal(an_item_get(), {"id": "7", "X-Trace": "abc\r\nX-Admin: yes"}) == (
        "the value for header 'X-Trace' carries a line break or NUL; refused"
    )


def test_the_json_body_is_the_argument_body_and_a_json_answer_is_asked_for():
    op = declared(method="POST", path="/items", body={"type": "object"}, output={"type": "object"})
    method, url, headers, body = request_of(op, {"body": {"name": "lamp"}}, base_url=BASE)
    assert (method, url, headers, body) == (
        "POST",
        "https://api.example.com/v1/items",
        {"Accept": "application/json"},
        {"name": "lamp"},
    )


def test_missing_and_unknown_arguments_are_refused_naming_them():
    assert refusal(an_item_get(), {"expand": True}) == "missing required arguments: id"
    assert refusal(an_item_get(), {"id": "7", "colour": "red"}) == (
        "unknown arguments: colour; this tool takes X-Trace, expand, id, tag"
    )
    op = declared(method="POST", path="/items", body={"type": "object"})
    assert refusal(op, {}) == "missing required arguments: body"


def test_a_document_path_that_leaves_the_base_path_is_refused_when_called():
    # operations_of refuses such a path already; this is the last check before a request is made.
    op = Operation(name="escape", method="GET", path="/../../admin")
    assert refusal(op, {}) == "the path /../../admin leaves the service's base path /v1"


# --- The answer -----------------------------------------------------------------------------------------------


def result(op: Operation, status: int, content_type: str, body: bytes, max_bytes: int = 1024) -> dict[str, Any]:
    rendered = result_of(op, status, content_type, body, max_bytes=max_bytes)
    types.CallToolResult.model_validate(rendered)
    return rendered


def test_a_json_object_answer_is_the_structured_content_and_its_compact_text():
    answer = result(an_item_get(), 200, "application/json; charset=utf-8", b'{"id": 7, "name": "l\\u00e4mp"}')
    assert answer == {
        "content": [{"type": "text", "text": '{"id":7,"name":"lämp"}'}],
        "structuredContent": {"id": 7, "name": "lämp"},
        "isError": False,
    }


def test_a_json_array_answer_is_wrapped_as_result():
    op = declared(path="/items", output={"type": "array"})
    answer = result(op, 200, "application/problem+json", b"[1, 2]")
    assert answer["structuredContent"] == {"result": [1, 2]} and answer["content"][0]["text"] == "[1,2]"
    assert result(an_item_get(), 200, "application/json", b"3")["structuredContent"] == {"result": 3}


def test_an_xml_answer_is_text():
    xml = b'<?xml version="1.0"?><feed xmlns="http://www.w3.org/2005/Atom"><title>Items</title></feed>'
    assert result(an_item_get(), 200, "application/atom+xml;type=feed", xml) == {
        "content": [{"type": "text", "text": xml.decode()}],
        "isError": False,
    }


def test_a_text_answer_over_the_cap_is_cut_and_says_so():
    answer = result(an_item_get(), 200, "text/plain; charset=iso-8859-1", "é".encode("latin-1") * 2000, 1000)
    assert answer["content"][0]["text"] == "é" * 1000 + "\n\n[cut: the answer is longer than 1,000 bytes]"


def test_a_json_answer_over_the_cap_is_not_parsed_and_is_an_error_when_a_structure_was_promised():
    body = b'{"items": [' + b"1," * 1000 + b"1]}"
    promised = result(declared(path="/items", output={"type": "object"}), 200, "application/json", body, 100)
    assert promised["isError"] is True and "structuredContent" not in promised
    assert promised["content"][0]["text"] == (
        body[:100].decode() + "\n\n[cut: the answer is longer than 100 bytes]\n[so it was not parsed as JSON]"
    )
    assert result(an_item_get(), 200, "application/json", body, 100)["isError"] is False


def test_an_answer_labelled_json_that_is_not_is_text_with_a_note():
    assert result(an_item_get(), 200, "application/json", b"<html>oops</html>") == {
        "content": [
            {"type": "text", "text": "<html>oops</html>\n\n[the answer is labelled JSON but is not valid JSON]"}
        ],
        "isError": False,
    }


def test_a_404_is_an_error_result_with_its_status_and_body():
    assert result(an_item_get(), 404, "application/json", b'{"detail": "no such item"}') == {
        "content": [{"type": "text", "text": 'HTTP 404 Not Found: {"detail": "no such item"}'}],
        "isError": True,
    }
    assert result(an_item_get(), 599, "", b"")["content"][0]["text"] == "HTTP 599"


def test_an_empty_answer_and_a_binary_one_are_described_in_words():
    assert result(an_item_get(), 204, "", b"")["content"][0]["text"] == (
        "HTTP 204 No Content: the call succeeded with an empty answer."
    )
    assert result(an_item_get(), 200, "image/png", b"\x89PNG....")["content"][0]["text"] == (
        "The answer is 8 bytes of image/png, which is not shown as text."
    )
