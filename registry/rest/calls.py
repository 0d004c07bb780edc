"""One tool call of a REST operation: its arguments as an HTTP request (request_of), and the HTTP answer as an MCP
CallToolResult (result_of). No I/O: the executor sends the request, with its timeout, size cap and egress guard.

A path parameter's value is one path segment whatever it holds: percent-encoded with nothing left safe (`/`,
`%`, CR and LF included), and a segment that would be `.` or `..` has its dots encoded, so no value reaches
another path. Unknown arguments are refused rather than dropped: a misspelt filter silently ignored would make a
wider query than the model asked for."""

import json
import posixpath
import re
from email.message import Message
from http import HTTPStatus
from typing import Any
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

from registry.rest.operations import BODY, TEMPLATE_VARIABLE, Operation, Parameter, is_json

HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", re.ASCII)
TEXT_MEDIA = frozenset(
    {"application/xml", "application/javascript", "application/yaml", "application/x-yaml", "application/graphql"}
)
TEXT_SUFFIXES = ("+xml", "+yaml")

Request = tuple[str, str, dict[str, str], Any | None]


class CallRefused(ValueError):
    """Arguments that make no request; the message says which, for the model to correct."""

    code = "rest_call_refused"


# --- The request ----------------------------------------------------------------------------------------------


def request_of(op: Operation, arguments: dict[str, Any], *, base_url: str) -> Request:
    """(method, URL, headers, JSON body or None) for a call. A null argument counts as absent."""
    _check_arguments(op, arguments)
    values = {p.argument: arguments[p.argument] for p in op.parameters if arguments.get(p.argument) is not None}
    pairs = [
        pair for p in op.parameters if p.location == "query" and p.argument in values for pair in _pairs(p, values)
    ]
    url = _url(base_url, _path(op, values), urlencode(pairs, quote_via=quote))
    body = arguments.get(BODY) if op.body_schema is not None else None
    return op.method, url, _headers(op, values), body


def _check_arguments(op: Operation, arguments: Any) -> None:
    if not isinstance(arguments, dict):
        raise CallRefused("the arguments must be an object")
    accepted = {p.argument for p in op.parameters} | ({BODY} if op.body_schema is not None else set())
    if unknown := sorted(set(arguments) - accepted):
        takes = ", ".join(sorted(accepted)) or "no arguments"
        raise CallRefused(f"unknown arguments: {', '.join(unknown)}; this tool takes {takes}")
    required = [p.argument for p in op.parameters if p.required] + ([BODY] if op.body_required else [])
    if missing := [argument for argument in required if arguments.get(argument) is None]:
        raise CallRefused(f"missing required arguments: {', '.join(missing)}")


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return str(value)


def _path(op: Operation, values: dict[str, Any]) -> str:
    by_name = {p.name: p for p in op.parameters if p.location == "path"}

    def value(match: re.Match[str]) -> str:
        parameter = by_name.get(match[1])
        if parameter is None or parameter.argument not in values:
            raise CallRefused(f"the path {op.path} needs {match[1]!r}, which no argument gives")
        found = values[parameter.argument]
        items = found if isinstance(found, list) else [found]  # an array: OpenAPI's simple style, `1,2,3`
        return ",".join(quote(_text(item), safe="") for item in items)

    return "/".join(_segment(template, TEMPLATE_VARIABLE.sub(value, template)) for template in op.path.split("/"))


def _segment(template: str, segment: str) -> str:
    # `.` and `..` are unreserved, so quote keeps them; as a whole segment made by values they would climb.
    # A template's own `..` stays, for _url to refuse.
    if segment in (".", "..") and segment != template:
        return segment.replace(".", "%2E")
    return segment


def _url(base_url: str, path: str, query: str) -> str:
    base = urlsplit(base_url)
    prefix = base.path.rstrip("/")
    full = prefix + path
    # What a server that removes dot segments would see must still be under the base URL's path.
    if not (posixpath.normpath(full) + "/").startswith(prefix + "/"):
        raise CallRefused(f"the path {path} leaves the service's base path {prefix or '/'}")
    return urlunsplit((base.scheme, base.netloc, full, "&".join(filter(None, (base.query, query))), ""))


def _pairs(parameter: Parameter, values: dict[str, Any]) -> list[tuple[str, str]]:
    value = values[parameter.argument]
    if not isinstance(value, list):
        return [(parameter.name, _text(value))]
    if parameter.explode:  # OpenAPI's default for a query array: `tag=a&tag=b`
        return [(parameter.name, _text(item)) for item in value]
    return [(parameter.name, ",".join(_text(item) for item in value))]


def _headers(op: Operation, values: dict[str, Any]) -> dict[str, str]:
    headers = {"Accept": op.answer_media_type} if op.answer_media_type else {}
    for p in op.parameters:
        if p.location == "header" and p.argument in values:
            value = values[p.argument]
            text = ",".join(_text(item) for item in value) if isinstance(value, list) else _text(value)
            headers[p.name] = _header_checked(p.name, text)
    return headers


def _header_checked(name: str, value: str) -> str:
    if not HEADER_NAME.fullmatch(name):
        raise CallRefused(f"{name!r} is not a valid HTTP header name")
    if any(char in value for char in "\r\n\0"):
        raise CallRefused(f"the value for header {name!r} carries a line break or NUL; refused")
    if not value.isascii():
        raise CallRefused(f"the value for header {name!r} must be ASCII text")
    return value


# --- The answer -----------------------------------------------------------------------------------------------


def result_of(op: Operation, status: int, content_type: str, body: bytes, *, max_bytes: int) -> dict[str, Any]:
    """The answer as an MCP CallToolResult (a plain dict). Pass up to max_bytes + 1 bytes of it, so that a cut
    answer is told from one of exactly max_bytes. Secrets are redacted by the gateway, not here."""
    cut, body = len(body) > max_bytes, body[:max_bytes]
    media, charset = _media(content_type)
    if not 200 <= status < 300:
        detail = f": {_decoded(body, charset)}{_cut_note(cut, max_bytes)}" if body else ""
        return _text_result(f"{_status(status)}{detail}", error=True)
    if not body:
        return _text_result(f"{_status(status)}: the call succeeded with an empty answer.")
    if is_json(media):
        return _json_result(op, body, charset, cut=cut, max_bytes=max_bytes)
    if not (media.startswith("text/") or media in TEXT_MEDIA or media.endswith(TEXT_SUFFIXES)):
        size = f"more than {max_bytes:,}" if cut else f"{len(body):,}"
        return _text_result(f"The answer is {size} bytes of {media}, which is not shown as text.")
    return _text_result(_decoded(body, charset) + _cut_note(cut, max_bytes))


def _json_result(op: Operation, body: bytes, charset: str, *, cut: bool, max_bytes: int) -> dict[str, Any]:
    # With an output schema promised, an answer that cannot be parsed is an error: there is no structure to give.
    if cut:
        text = f"{_decoded(body, charset)}{_cut_note(cut, max_bytes)}\n[so it was not parsed as JSON]"
        return _text_result(text, error=op.output_schema is not None)
    try:
        value = json.loads(_decoded(body, charset))
    except (ValueError, RecursionError):
        text = f"{_decoded(body, charset)}\n\n[the answer is labelled JSON but is not valid JSON]"
        return _text_result(text, error=op.output_schema is not None)
    structured = value if isinstance(value, dict) and not op.output_wrapped else {"result": value}
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return {"content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": False}


def _text_result(text: str, *, error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": error}


def _media(content_type: str) -> tuple[str, str]:
    """(media type, charset), parsed the way the standard library parses MIME headers: text/plain when there
    is none or it is malformed."""
    message = Message()
    message["content-type"] = content_type
    return message.get_content_type(), message.get_content_charset() or "utf-8"


def _decoded(body: bytes, charset: str) -> str:
    try:
        return body.decode(charset, errors="replace")
    except LookupError:  # a charset Python does not know
        return body.decode("utf-8", errors="replace")


def _cut_note(cut: bool, max_bytes: int) -> str:
    return f"\n\n[cut: the answer is longer than {max_bytes:,} bytes]" if cut else ""


def _status(status: int) -> str:
    """`HTTP 404 Not Found`, or `HTTP 599` for a status without a standard reason."""
    try:
        return f"HTTP {status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"
