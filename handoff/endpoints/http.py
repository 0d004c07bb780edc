"""`/mcp` over Streamable HTTP: admission (host, origin, key, method, body) in front of the project's own
transport (handoff/endpoints/streamable_http/), which the `MCP-Protocol-Version` header routes to its era."""

import asyncio
from functools import lru_cache
from typing import Any

from django.conf import settings
from mcp import types
from mcp.server.streamable_http import check_accept_headers
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request

from handoff.endpoints.streamable_http import legacy, modern
from handoff.endpoints.streamable_http.wire import error_answer, json_answer
from handoff.loop_lag import LoopLag
from handoff.mcp.audit_rows import refusal_record
from handoff.mcp.caller import Caller, Refused, caller_from_scope, header, host_allowed, origin_allowed
from handoff.mcp.frames import FrameError, frame_id, parse_frame, retry_later
from handoff.snapshot import ConfigurationUnavailable
from handoff.web_process import background_start

# What a POST must accept, in both eras: an answer may be JSON or a stream.
NOT_ACCEPTABLE = "Not Acceptable: send 'Accept: application/json, text/event-stream'"
NOT_JSON = "Unsupported Media Type: send 'Content-Type: application/json'"
NOT_A_MESSAGE = "Invalid Request: the message does not match any JSON-RPC 2.0 shape"
METHODS = (b"allow", b"GET, POST, DELETE")
# uvicorn (httptools) bounds no request's headers: past this they are refused first, before the key check, since
# a flood of 100 KiB headers carrying a good key was served as calls (docs/reliability.md). A JWT is a few KiB;
# HAProxy's default buffer holds 16 KiB of headers.
MAX_HEADER_BYTES = 32 * 1024
HEADERS_TOO_LARGE = f"Request Header Fields Too Large: send at most {MAX_HEADER_BYTES} bytes of headers"
# Shed before the body is parsed: so its id is unknown, and the answer is always the same for each line.
BUSY = "Server busy: this gateway process serves as many requests as it may (GATEWAY_MAX_IN_FLIGHT). Retry in 1 s."
LATE = "Server busy: this gateway process's event loop runs late (past GATEWAY_MAX_LOOP_LAG_MS). Retry in 1 s."


BUSY_BODY, LATE_BODY = retry_later("SERVER_BUSY", BUSY, 1), retry_later("SERVER_BUSY", LATE, 1)


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


class InFlight:
    """The POSTs this process serves now (one event loop: no lock), counted once their body has arrived, so that a
    client that sends it slowly holds no place. Past GATEWAY_MAX_IN_FLIGHT a new one is refused at once, not
    queued: a refusal costs microseconds, a queue lengthens every admitted call's wait."""

    count = 0


async def mcp_http_app(scope: dict, receive: Any, send: Any) -> None:
    if sum(len(name) + len(value) for name, value in scope["headers"]) > MAX_HEADER_BYTES:
        return await error_answer(send, 431, types.INVALID_REQUEST, HEADERS_TOO_LARGE)
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
    if method != "POST":
        return await _served(scope, receive, send, caller, {})
    if not _accepts_both(header(scope, b"accept") or ""):
        return await error_answer(send, 406, types.INVALID_REQUEST, NOT_ACCEPTABLE)
    if not (header(scope, b"content-type") or "").lower().startswith("application/json"):
        return await error_answer(send, 415, types.INVALID_REQUEST, NOT_JSON)
    limit, wait = settings.GATEWAY_MAX_BODY_BYTES, settings.GATEWAY_BODY_SECONDS
    declared = header(scope, b"content-length")
    try:
        if declared and declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge
        async with asyncio.timeout(wait):
            body = await _read_body(receive, limit)
    except BodyTooLarge:
        return await error_answer(send, 413, types.INVALID_REQUEST, f"Request body over {limit} bytes")
    except TimeoutError:
        return await error_answer(send, 408, types.INVALID_REQUEST, f"Request body not received within {wait:g} s")
    if InFlight.count >= settings.GATEWAY_MAX_IN_FLIGHT:
        return await json_answer(send, 503, BUSY_BODY, [(b"retry-after", b"1")])
    if LoopLag.too_late():
        return await json_answer(send, 503, LATE_BODY, [(b"retry-after", b"1")])
    InFlight.count += 1
    try:
        try:
            payload = parse_frame(body)
        except FrameError as exc:
            return await error_answer(send, 400, exc.code, exc.message, request_id=exc.request_id)
        await _served(scope, receive, send, caller, payload)
    finally:
        InFlight.count -= 1


@lru_cache(maxsize=64)
def _accepts_both(accept: str) -> bool:
    """The SDK's check of a POST's Accept, once per value: clients send the same one or two."""
    return all(check_accept_headers(Request({"type": "http", "headers": [(b"accept", accept.encode("latin-1"))]})))


async def _served(scope: dict, receive: Any, send: Any, caller: Caller, payload: dict) -> None:
    version = header(scope, b"mcp-protocol-version")
    era = modern if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS else legacy
    background_start()
    if era is modern:
        return await modern.serve(scope, receive, send, caller, payload)
    try:
        message = types.jsonrpc_message_adapter.validate_python(payload, by_name=False) if payload else None
    except ValidationError:
        return await error_answer(send, 400, types.INVALID_REQUEST, NOT_A_MESSAGE, request_id=frame_id(payload))
    await legacy.serve(scope, receive, send, caller, message)
