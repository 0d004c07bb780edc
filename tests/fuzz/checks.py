"""A frame from an agent through the checks every transport makes, and what must hold of the answer to a refused one."""

import json
from typing import Any

from mcp import types
from pydantic import ValidationError

from handoff.mcp.frames import FrameError, encode_message, frame_id, parse_frame

# The codes a frame's first check answers with (docs/protocol.md).
FRAME_CODES = {types.PARSE_ERROR, types.INVALID_REQUEST, types.INVALID_PARAMS}


def answered(body: str) -> dict[str, Any]:
    """An error answer as the agent reads it: JSON, one JSON-RPC error, UTF-8 on the wire."""
    body.encode()
    answer = json.loads(body)
    assert answer["jsonrpc"] == "2.0" and set(answer) == {"jsonrpc", "id", "error"}, answer
    assert answer["error"]["code"] in FRAME_CODES and answer["error"]["message"], answer
    return answer


def check_frame(raw: bytes | str) -> types.JSONRPCMessage | None:
    """The frame through the transports' checks: the message they hand to `handle`, or None when refused."""
    try:
        payload = parse_frame(raw)
    except FrameError as exc:
        answered(exc.body())
        return None
    assert isinstance(payload, dict)
    try:
        message = types.jsonrpc_message_adapter.validate_python(payload, by_name=False)
    except ValidationError:
        answered(FrameError(types.INVALID_REQUEST, "Invalid Request", frame_id(payload)).body())
        return None
    if isinstance(message, types.JSONRPCRequest):  # its reply repeats its id, and must still go out
        reply = encode_message(types.JSONRPCResponse(jsonrpc="2.0", id=message.id, result={}))
        assert reply is not None and json.loads(reply)["id"] == message.id
    return message
