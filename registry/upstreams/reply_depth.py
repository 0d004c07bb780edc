"""An upstream's replies nested deeper than GATEWAY_MAX_JSON_DEPTH (the limit agents' frames have) never
reach an agent: the request they answer gets an error naming the upstream instead.

The SDK's transports parse what an upstream sends (stdio lines, HTTP bodies, SSE events) before anything
here sees it, with pydantic's parser, which does not recurse in Python and gives up near 200 levels. So
the check wraps the transport's read stream: a parsed reply is measured without recursion, and a reply the
parser gave up on is matched to its request by the id at its top level (otherwise the call would wait for
its timeout)."""

import json
import re
from typing import Any

from django.conf import settings
from mcp import types
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from gateway_project.lib.json_depth import STRING

TOO_DEEP = {"code": "UPSTREAM_REPLY_TOO_DEEP"}  # the data of the error that stands in for such a reply
PARSER_GAVE_UP = "recursion limit exceeded"  # pydantic's words for JSON nested beyond its limit
TOKEN = re.compile(STRING.pattern + rb"|[\[\]{}]", re.S)
MEMBER = re.compile(rb'"(id|method)"\s*:\s*(-?\d+(?![.eE\d])|"[^"\\]*(?:\\.[^"\\]*)*")?')


def reply_too_deep(exc: MCPError) -> bool:
    """Whether the error a request got is the one that stands in for a reply nested too deep."""
    return exc.error.data == TOO_DEEP


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether parsed JSON nests lists and dicts deeper than `limit` (the value itself being level 1)."""
    pending = [(value, 1)] if isinstance(value, dict | list) else []
    while pending:
        item, level = pending.pop()
        if level > limit:
            return True
        inside = item.values() if isinstance(item, dict) else item
        pending += [(inner, level + 1) for inner in inside if isinstance(inner, dict | list)]
    return False


def unparsed_reply_id(raw: str) -> int | str | None:
    """The id at the top level of a JSON-RPC response too deep to parse, from one linear scan; None when
    there is none, or when the message is a request or notification (it names a method)."""
    depth, members = 0, {}
    text = raw.encode("utf-8", "surrogatepass")
    for token in TOKEN.finditer(text):
        first = token.group()[:1]
        if first in (b"[", b"{"):
            depth += 1
        elif first in (b"]", b"}"):
            depth -= 1
        elif depth == 1 and (member := MEMBER.match(text, token.start())):
            members[member.group(1)] = member.group(2)
    found = members.get(b"id")
    return json.loads(found) if found and b"method" not in members else None


def _refusal(request_id: int | str, upstream: str) -> SessionMessage:
    limit = settings.GATEWAY_MAX_JSON_DEPTH
    message = (
        f"The upstream {upstream!r} answered with JSON nested deeper than {limit} levels, "
        "which the gateway does not pass on."
    )
    error = types.ErrorData(code=types.INTERNAL_ERROR, message=message, data=TOO_DEEP)
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))


def checked(item: SessionMessage | Exception, upstream: str) -> SessionMessage | Exception:
    """What the transport read, with a reply nested too deep replaced by an error for its request."""
    limit = settings.GATEWAY_MAX_JSON_DEPTH
    if isinstance(item, SessionMessage):
        message = item.message
        if isinstance(message, types.JSONRPCResponse) and nests_deeper_than(message.result, limit - 1):
            return _refusal(message.id, upstream)
        # Over HTTP the SDK answers a body or event it could not parse with a parse error for the request.
        error = message.error if isinstance(message, types.JSONRPCError) else None
        if error and error.code == types.PARSE_ERROR and PARSER_GAVE_UP in error.message:
            return _refusal(message.id, upstream)
    elif isinstance(item, ValidationError) and PARSER_GAVE_UP in str(item):
        raw = item.errors()[0].get("input")
        if isinstance(raw, str) and (request_id := unparsed_reply_id(raw)) is not None:
            return _refusal(request_id, upstream)
    return item


class DepthCheckedStream:
    """The transport's read stream, with every reply nested too deep replaced by an error for its request
    (`checked`: a stdio transport's direct requests, registry/upstreams/direct.py, have theirs checked there)."""

    def __init__(self, inner: Any, upstream: str) -> None:
        self._inner = inner
        self._upstream = upstream

    @property
    def last_context(self) -> Any:  # the SDK's dispatcher looks for it on context-carrying streams
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        return checked(await self._inner.receive(), self._upstream)

    def __aiter__(self) -> "DepthCheckedStream":
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        return checked(await self._inner.__anext__(), self._upstream)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> "DepthCheckedStream":
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._inner.__aexit__(*exc_info)


class DepthCheckedTransport:
    """A client transport (stdio, Streamable HTTP, SSE) whose replies are checked for depth."""

    def __init__(self, transport: Any, upstream: str) -> None:
        self._transport = transport
        self._upstream = upstream

    async def __aenter__(self) -> tuple[DepthCheckedStream, Any]:
        read, write = await self._transport.__aenter__()
        return DepthCheckedStream(read, self._upstream), write

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._transport.__aexit__(*exc_info)
