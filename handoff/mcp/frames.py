"""The first look at an incoming JSON-RPC frame, shared by every transport: is it JSON no deeper than
GATEWAY_MAX_JSON_DEPTH, is it one JSON-RPC 2.0 message, and is its text Unicode where it must be? Anything
finer is the SDK's to check."""

import json
import logging
import re
from typing import Any

from django.conf import settings
from mcp import types
from pydantic_core import PydanticSerializationError

from gateway_project.lib.json_depth import nested_deeper_than
from policy.decisions import RETRY_LATER

logger = logging.getLogger(__name__)
UNENCODABLE = (
    "Invalid params: the request holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair) "
    "that its reply would repeat; send the text as valid Unicode"
)


class FrameError(Exception):
    def __init__(self, code: int, message: str, request_id: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.request_id = code, message, request_id

    def body(self) -> str:
        return json.dumps(
            {"jsonrpc": "2.0", "id": self.request_id, "error": {"code": self.code, "message": self.message}}
        )


def retry_later(code: str, message: str, seconds: float, request_id: Any = None) -> str:
    """The error body of a request not served now that may be later: -32003, its `code`, and when."""
    error = {"code": RETRY_LATER, "message": message, "data": {"code": code, "retryAfter": float(seconds)}}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error})


def frame_id(payload: dict[str, Any]) -> str | int | None:
    """The id to answer with: the frame's own when it is a valid JSON-RPC id, else null."""
    request_id = payload.get("id")
    return request_id if isinstance(request_id, str | int) and not isinstance(request_id, bool) else None


def is_unicode(value: Any) -> bool:
    """False when a string in `value` holds a lone UTF-16 surrogate (JSON allows "\\ud800"; nothing can
    encode it, so every later step that serialises it fails)."""
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


# Where a lone surrogate can come from in a frame's bytes: a \\uD800-\\uDFFF escape, or one encoded as UTF-8
# (ED A0-BF), which json.loads lets through; a frame with neither holds none, and skips the checks below.
SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _may_hold_surrogates(raw: bytes | str) -> bool:
    # A NUL byte: UTF-16 or UTF-32, which json.loads also reads, and whose surrogates the pattern misses.
    return not isinstance(raw, bytes) or b"\x00" in raw or SURROGATE.search(raw) is not None


def parse_frame(raw: bytes | str) -> dict[str, Any]:
    """The frame as a dict, or FrameError with the JSON-RPC code and a message a client can act on."""
    limit = settings.GATEWAY_MAX_JSON_DEPTH
    if nested_deeper_than(raw, limit):
        raise FrameError(types.PARSE_ERROR, f"Parse error: JSON nested deeper than {limit} levels")
    try:
        payload = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise FrameError(types.PARSE_ERROR, "Parse error: the body is not valid JSON") from None
    if not isinstance(payload, dict):
        raise FrameError(
            types.INVALID_REQUEST, "Invalid Request: send one JSON-RPC 2.0 object (batches are not part of MCP)"
        )
    surrogates = _may_hold_surrogates(raw)
    if surrogates and not is_unicode(payload.get("id")):
        raise FrameError(types.INVALID_REQUEST, 'Invalid Request: "id" holds a lone UTF-16 surrogate')
    request_id = frame_id(payload)
    is_message = isinstance(payload.get("method"), str) or (
        "id" in payload and ("result" in payload or "error" in payload)
    )
    if payload.get("id") is not None and request_id is None:
        raise FrameError(types.INVALID_REQUEST, 'Invalid Request: "id" must be a string or an integer')
    if payload.get("jsonrpc") != "2.0" or not is_message:
        raise FrameError(
            types.INVALID_REQUEST,
            "Invalid Request: expected a JSON-RPC 2.0 request, notification "
            'or response ("jsonrpc": "2.0" and a "method")',
            request_id,
        )
    if surrogates:
        _check_text(payload, request_id)
    return payload


def _check_text(payload: dict[str, Any], request_id: Any) -> None:
    if not is_unicode(payload.get("method")):
        raise FrameError(types.INVALID_REQUEST, 'Invalid Request: "method" holds a lone UTF-16 surrogate', request_id)
    params = payload.get("params")
    if isinstance(params, dict) and not is_unicode(params.get("arguments")):
        raise FrameError(
            types.INVALID_PARAMS,
            "Invalid params: the arguments hold a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its "
            "pair); send the text as valid Unicode",
            request_id,
        )


def encode_message(message: types.JSONRPCMessage) -> str | None:
    """The frame for a message going out. A reply that cannot be encoded (a lone surrogate the agent sent,
    echoed back: a URI, say) becomes an error for its request instead of failing the transport."""
    try:
        return message.model_dump_json(by_alias=True, exclude_unset=True)
    except PydanticSerializationError:
        if not isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            logger.warning("dropped a %s that cannot be encoded", type(message).__name__, exc_info=True)
            return None
        return FrameError(types.INVALID_PARAMS, UNENCODABLE, message.id).body()
