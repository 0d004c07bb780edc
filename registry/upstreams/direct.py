"""A stdio server's requests written by the pool itself, their answers handed straight back by the transport's
reader: no SDK session between (issue 39: the SDK's client cost 0.16 ms of CPU a call where a bare JSON-lines
exchange costs 0.025; most of it the session's tasks, memory streams and spans, not its parsing).

Only what needs nothing of the session goes this way (requests.py `calling`: a tools/call that relays nothing);
everything else the server sends meanwhile (its requests, notifications) still reaches the SDK session on the
same pipes. What a request says is the session's own: its era's `_meta` stamp, the same parse and depth check
of the answer (reply_depth.py), the same errors (MCPError, CONNECTION_CLOSED once the server's output ended),
and a `notifications/cancelled` through the session when a written request is abandoned.

An answer of the plain shape is read by `json.loads` alone (`answered`), before the SDK's pydantic parse, which
cost the reader twice as much; any other line (an odd shape, a reply too deep) still goes the SDK's way, so
it is read, checked and refused exactly as before."""

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from itertools import count
from typing import Any

import anyio
from django.conf import settings
from mcp import types
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from registry.upstreams.reply_depth import checked, nests_deeper_than

PREFIX = "switchboard-"  # the ids of requests written here: the SDK session's own are integers
CANCEL_WRITE = 5.0  # bound on the shielded write of a cancellation, as the SDK's (a wedged pipe must not hang it)
# json.loads takes a lone UTF-16 surrogate the SDK's parser refuses: a line with any escaped surrogate goes its way.
ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
Answer = dict[str, Any] | types.ErrorData  # what a direct request got: its result, or the error that answered it


class DirectLine:
    """One stdio transport's direct requests. The transport binds its writer (`bind`), offers the reader's every
    line (`answered`), then every one it did not answer once parsed (`take`), and closes it once the server's
    output ends or the transport stops (`close`)."""

    def __init__(self, upstream: str) -> None:
        self._upstream = upstream
        self._send: Callable[[bytes], Awaitable[None]] | None = None
        self._pending: dict[str, asyncio.Future[Answer]] = {}
        self._ids = count(1)
        self._closed = False

    def bind(self, send: Callable[[bytes], Awaitable[None]]) -> None:
        self._send = send

    @property
    def open(self) -> bool:
        return self._send is not None and not self._closed

    def answered(self, line: str) -> bool:
        """Whether `line`, unparsed, answered a direct request (which now has it): False leaves it to `take`."""
        if not self._pending or PREFIX not in line or ESCAPED_SURROGATE.search(line):
            return False
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            return False
        request_id = message.get("id") if type(message) is dict else None
        if type(request_id) is not str or request_id not in self._pending or (answer := _plain(message, line)) is None:
            return False
        self._answer(request_id, answer)
        return True

    def take(self, item: SessionMessage | Exception) -> SessionMessage | Exception | None:
        """None when `item` answered a direct request (which now has it); else the item, for the session."""
        if not self._pending:
            return item
        item = checked(item, self._upstream)
        message = item.message if isinstance(item, SessionMessage) else None
        if not isinstance(message, types.JSONRPCResponse | types.JSONRPCError) or not isinstance(message.id, str):
            return item
        if message.id not in self._pending:
            return item
        self._answer(message.id, message.result if isinstance(message, types.JSONRPCResponse) else message.error)
        return None

    def _answer(self, request_id: str, answer: Answer) -> None:
        waiting = self._pending.pop(request_id)
        if not waiting.done():  # else its caller was cancelled meanwhile
            waiting.set_result(answer)

    def close(self) -> None:
        """The server's output ended: no answer will come to what waits, nor any later request."""
        self._closed = True
        closed = types.ErrorData(code=types.CONNECTION_CLOSED, message="Connection closed")
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
            answer = await waiting
        except anyio.get_cancelled_exc_class():
            # Cancelled in the write or after: a write interrupted may still have reached the server.
            await _cancel(session, request_id)
            raise
        finally:
            self._pending.pop(request_id, None)
        if isinstance(answer, types.ErrorData):
            raise MCPError.from_error_data(answer)
        return answer


def _plain(message: dict[str, Any], line: str) -> Answer | None:
    """The result or error of an answer (`line`, parsed) the SDK's parse reads as it is; None for any other (a
    request's members, both result and error, a member it would coerce or refuse) and for what reply_depth.py's
    `checked` judges (nesting, a parse error, which it may read as a reply too deep)."""
    if message.get("jsonrpc") != "2.0" or "method" in message:
        return None
    limit = settings.GATEWAY_MAX_JSON_DEPTH
    # A line with no more brackets than the limit cannot nest deeper (those in strings only count more): the
    # walk, which cost the reader as much as the parse, is for the rest.
    if line.count("{") + line.count("[") > limit and nests_deeper_than(message, limit):
        return None
    result, error = message.get("result"), message.get("error")
    if type(result) is dict and "error" not in message:
        return result
    if type(error) is dict and "result" not in message and type(code := error.get("code")) is int:
        if code != types.PARSE_ERROR and type(error.get("message")) is str:
            return types.ErrorData.model_validate(error)
    return None


async def _cancel(session: Any, request_id: str) -> None:
    """Tell the server an abandoned request's answer is no longer wanted, as the SDK session does for its own."""
    cancelled = types.CancelledNotification(
        params=types.CancelledNotificationParams(request_id=request_id, reason="caller cancelled")
    )
    with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_WRITE):
        await session.send_notification(cancelled)
