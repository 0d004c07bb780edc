"""2026-07-28 over Streamable HTTP: every POST is a self-contained request (no session, no handshake), checked
on the SDK's ladder (routing headers against the body, the served versions, `Mcp-Param-*` headers against
the tool's schema) and answered on its own; closing the answer cancels the request (the era's rule)."""

import json
from typing import Any

from mcp import types
from mcp.server._streamable_http_modern import _mcp_param_rejection  # the SDK's own header check, not copied
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    InboundLadderRejection,
    classify_inbound_request,
    find_duplicated_routing_header,
    unsupported_protocol_version_rejection,
)
from mcp_types import HEADER_MISMATCH
from pydantic import ValidationError
from starlette.requests import Request

from handoff.endpoints.streamable_http import exchange
from handoff.endpoints.streamable_http.streams import EventStream
from handoff.endpoints.streamable_http.wire import empty_answer, error_answer, json_answer, until_gone
from handoff.mcp.caller import Caller, header
from handoff.mcp.handle import MODERN, McpSession
from handoff.mcp.server import server

NO_HANDSHAKE = "Method not found: 2026-07-28 has no initialize; each request carries its version and capabilities"
NOT_ONE_REQUEST = "Invalid Request: the body must be a single JSON-RPC request or notification object"


def _status(code: int | None) -> int:
    return 200 if code is None else ERROR_CODE_HTTP_STATUS.get(code, 200)


async def _reject(send: Any, rejection: InboundLadderRejection, request_id: Any = None) -> None:
    error = types.JSONRPCError(
        jsonrpc="2.0",
        id=request_id,
        error=types.ErrorData(code=rejection.code, message=rejection.message, data=rejection.data),
    )
    body = error.model_dump(mode="json", by_alias=True, exclude_none=True) | {"id": request_id}
    await json_answer(send, _status(rejection.code), json.dumps(body, separators=(",", ":")))


async def _no_push(message: types.JSONRPCMessage) -> None:
    """A 2026-07-28 request has no channel beside its own answer."""


async def serve(scope: dict, receive: Any, send: Any, caller: Caller, payload: dict) -> None:
    if scope["method"] != "POST":
        return await empty_answer(send, 405, [(b"allow", b"POST")])
    if "id" not in payload:  # a notification: nothing on this wire acts on one (cancelling is closing the answer)
        rejection = unsupported_protocol_version_rejection(header(scope, b"mcp-protocol-version") or "")
        return await (_reject(send, rejection) if rejection else empty_answer(send, 202))
    try:
        request = types.JSONRPCRequest.model_validate(payload)
    except ValidationError:
        return await error_answer(send, 400, types.INVALID_REQUEST, NOT_ONE_REQUEST)
    if request.method == "initialize":  # the era has no handshake: the method is gone, not malformed
        gone = InboundLadderRejection(code=types.METHOD_NOT_FOUND, message=NO_HANDSHAKE)
        return await _reject(send, gone, request.id)
    raw = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]]
    if duplicated := find_duplicated_routing_header(raw):
        message = f"{duplicated} header appears more than once"
        return await _reject(send, InboundLadderRejection(code=HEADER_MISMATCH, message=message), request.id)
    route = classify_inbound_request(payload, headers=dict(raw))
    if isinstance(route, InboundLadderRejection):
        return await _reject(send, route, request.id)
    scope["switchboard.caller"] = caller
    if rejection := await _mcp_param_rejection(server, Request(scope), request, route, None):
        return await _reject(send, rejection, request.id)
    session = McpSession(_no_push, era=MODERN)
    stream = EventStream("")
    running = exchange.run(request, session, caller, stream)
    try:
        await until_gone(receive, _answer(send, stream))
    finally:
        running.scope.cancel()  # the client went, or the answer is out and the request is done already


async def _answer(send: Any, stream: EventStream) -> None:
    if not await exchange.answer(send, stream, (), _status):
        await exchange.stream_out(send, stream)
