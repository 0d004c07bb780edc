"""A stdio server's requests written by the pool itself, their answers handed straight back by the transport's
reader: no SDK session between (issue 39: the SDK's client cost 0.16 ms of CPU a call where a bare JSON-lines
exchange costs 0.025; most of it the session's tasks, memory streams and spans, not its parsing).

Only what needs nothing of the session goes this way (requests.py `calling`: a tools/call that relays nothing);
everything else the server sends meanwhile (its requests, notifications) still reaches the SDK session on the
same pipes. What a request says is the session's own: its era's `_meta` stamp, the same parse and depth check
of the answer (reply_depth.py), the same errors (MCPError, CONNECTION_CLOSED once the server's output ended),
and a `notifications/cancelled` through the session when a written request is abandoned."""

import asyncio
import json
from collections.abc import Awaitable, Callable
from itertools import count
from typing import Any

import anyio
from mcp import types
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from registry.upstreams.reply_depth import checked

PREFIX = "switchboard-"  # the ids of requests written here: the SDK session's own are integers
CANCEL_WRITE = 5.0  # bound on the shielded write of a cancellation, as the SDK's (a wedged pipe must not hang it)


class DirectLine:
    """One stdio transport's direct requests. The transport binds its writer (`bind`), offers the reader's every
    parsed line (`take`) and closes it once the server's output ends or the transport stops (`close`)."""

    def __init__(self, upstream: str) -> None:
        self._upstream = upstream
        self._send: Callable[[bytes], Awaitable[None]] | None = None
        self._pending: dict[str, asyncio.Future[types.JSONRPCResponse | types.JSONRPCError]] = {}
        self._ids = count(1)
        self._closed = False

    def bind(self, send: Callable[[bytes], Awaitable[None]]) -> None:
        self._send = send

    @property
    def open(self) -> bool:
        return self._send is not None and not self._closed

    def take(self, item: SessionMessage | Exception) -> SessionMessage | Exception | None:
        """None when `item` answered a direct request (which now has it); else the item, for the session."""
        if not self._pending:
            return item
        item = checked(item, self._upstream)
        message = item.message if isinstance(item, SessionMessage) else None
        if not isinstance(message, types.JSONRPCResponse | types.JSONRPCError) or not isinstance(message.id, str):
            return item
        waiting = self._pending.pop(message.id, None)
        if waiting is None:
            return item
        if not waiting.done():  # else its caller was cancelled meanwhile
            waiting.set_result(message)
        return None

    def close(self) -> None:
        """The server's output ended: no answer will come to what waits, nor any later request."""
        self._closed = True
        closed = types.JSONRPCError(
            jsonrpc="2.0", id="", error=types.ErrorData(code=types.CONNECTION_CLOSED, message="Connection closed")
        )
        for waiting in self._pending.values():
            if not waiting.done():
                waiting.set_result(closed)
        self._pending.clear()

    async def request(self, session: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The result of `method` sent on `session`'s pipes; MCPError for an error answer or a closed connection."""
        if not self.open:
            raise MCPError(code=types.CONNECTION_CLOSED, message="Connection closed")
        assert self._send is not None
        request_id, data = f"{PREFIX}{next(self._ids)}", {"method": method, "params": params}
        session._stamp(data, {})  # the era's _meta (2026-07-28: version, client info, capabilities), the SDK's own
        line = json.dumps({"jsonrpc": "2.0", "id": request_id, **data}, separators=(",", ":")) + "\n"
        self._pending[request_id] = waiting = asyncio.get_running_loop().create_future()
        try:
            await self._send(line.encode())
            message = await waiting
        except anyio.get_cancelled_exc_class():
            # Cancelled in the write or after: a write interrupted may still have reached the server.
            await _cancel(session, request_id)
            raise
        finally:
            self._pending.pop(request_id, None)
        if isinstance(message, types.JSONRPCError):
            raise MCPError.from_error_data(message.error)
        return message.result


async def _cancel(session: Any, request_id: str) -> None:
    """Tell the server an abandoned request's answer is no longer wanted, as the SDK session does for its own."""
    cancelled = types.CancelledNotification(
        params=types.CancelledNotificationParams(request_id=request_id, reason="caller cancelled")
    )
    with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_WRITE):
        await session.send_notification(cancelled)
