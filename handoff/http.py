"""`/mcp` over Streamable HTTP: admission (host, origin, key, method, body) in front of the project's own
transport (handoff/streamable_http/), which the `MCP-Protocol-Version` header routes to its era."""

from typing import Any

from django.conf import settings
from mcp import types
from mcp.server.streamable_http import check_accept_headers
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request

from handoff.mcp.audit_rows import refusal_record
from handoff.mcp.caller import Refused, caller_from_scope, header, host_allowed, origin_allowed
from handoff.mcp.frames import FrameError, frame_id, parse_frame
from handoff.snapshot import ConfigurationUnavailable
from handoff.streamable_http import legacy, modern
from handoff.streamable_http.wire import error_answer
from handoff.web_process import background_start

# What a POST must accept, in both eras: an answer may be JSON or a stream.
NOT_ACCEPTABLE = "Not Acceptable: send 'Accept: application/json, text/event-stream'"
NOT_JSON = "Unsupported Media Type: send 'Content-Type: application/json'"
NOT_A_MESSAGE = "Invalid Request: the message does not match any JSON-RPC 2.0 shape"
METHODS = (b"allow", b"GET, POST, DELETE")


class BodyTooLarge(Exception):
    pass


async def _read_body(receive: Any, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks)
        size += len(message.get("body", b""))
        if size > limit:
            raise BodyTooLarge
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def mcp_http_app(scope: dict, receive: Any, send: Any) -> None:
    if not host_allowed(scope):
        return await error_answer(send, 400, types.INVALID_REQUEST, "Host not allowed")
    if not origin_allowed(scope):
        return await error_answer(send, 403, types.INVALID_REQUEST, "Origin not allowed")
    try:
        caller = await caller_from_scope(scope, "http")
    except ConfigurationUnavailable as exc:
        return await error_answer(send, 503, exc.error.code, exc.error.message, [(b"retry-after", b"1")])
    except Refused as refused:
        await refusal_record("http", refused)
        headers = [(b"www-authenticate", refused.challenge.encode())]
        return await error_answer(send, refused.status, types.INVALID_REQUEST, refused.message, headers)
    method = scope["method"]
    if method not in ("GET", "POST", "DELETE"):
        return await error_answer(send, 405, types.INVALID_REQUEST, "Method Not Allowed", [METHODS])
    version = header(scope, b"mcp-protocol-version")
    era = modern if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS else legacy
    payload: dict = {}
    if method == "POST":
        if not all(check_accept_headers(Request(scope))):
            return await error_answer(send, 406, types.INVALID_REQUEST, NOT_ACCEPTABLE)
        if not (header(scope, b"content-type") or "").lower().startswith("application/json"):
            return await error_answer(send, 415, types.INVALID_REQUEST, NOT_JSON)
        limit = settings.GATEWAY_MAX_BODY_BYTES
        declared = header(scope, b"content-length")
        try:
            if declared and declared.isdigit() and int(declared) > limit:
                raise BodyTooLarge
            payload = parse_frame(await _read_body(receive, limit))
        except BodyTooLarge:
            return await error_answer(send, 413, types.INVALID_REQUEST, f"Request body over {limit} bytes")
        except FrameError as exc:
            return await error_answer(send, 400, exc.code, exc.message, request_id=exc.request_id)
    background_start()
    if era is modern:
        return await modern.serve(scope, receive, send, caller, payload)
    try:
        message = types.jsonrpc_message_adapter.validate_python(payload, by_name=False) if payload else None
    except ValidationError:
        return await error_answer(send, 400, types.INVALID_REQUEST, NOT_A_MESSAGE, request_id=frame_id(payload))
    await legacy.serve(scope, receive, send, caller, message)
