"""Pages of the aggregated lists. A cursor is opaque to agents and signed, so it cannot be forged into
another list or made up; an expired or foreign one is refused with a message that says how to start over."""

from typing import Any

from django.conf import settings
from django.core import signing
from mcp import types
from mcp.shared.exceptions import MCPError

SALT = "switchboard.list-cursor"


def list_page(method: str, items: list[Any] | tuple[Any, ...], cursor: str | None) -> tuple[list[Any], str | None]:
    """The page of `items` that `cursor` points at, and the cursor of the next page (None on the last)."""
    start = _offset(method, cursor) if cursor is not None else 0
    end = start + settings.GATEWAY_LIST_PAGE_SIZE
    following = signing.dumps([method, end], salt=SALT, compress=True) if end < len(items) else None
    return list(items[start:end]), following


def _offset(method: str, cursor: str) -> int:
    try:
        listed, offset = signing.loads(cursor, salt=SALT, max_age=settings.GATEWAY_LIST_CURSOR_SECONDS)
    except (signing.BadSignature, ValueError, TypeError):
        listed, offset = None, None
    if listed != method or not isinstance(offset, int) or offset < 0:
        message = f"Invalid or expired cursor: call {method} without a cursor to start from the first page."
        raise MCPError(types.INVALID_PARAMS, message)
    return offset
