"""One request's answer, the same in both eras: its messages (what its handler sends, then its reply) go into
an event stream straight from its own task (the MCP layer's `start`); the answer is JSON when the first of them
is the reply, and SSE when something comes first (progress, a log line, a question for the agent) or nothing
has come within JSON_WAIT_SECONDS: a slow call's answer starts at once as a stream, so that no client or proxy
waiting for its first byte gives up on it (the SDK's client reads a JSON answer with its short timeout, a stream
with its long one)."""

import asyncio
import logging
from collections.abc import Callable

from mcp import types
from mcp.server.streamable_http import REQUEST_CANCELLED

from handoff.endpoints.streamable_http.streams import EventStream
from handoff.endpoints.streamable_http.wire import SSE, Headers, json_answer, ping_seconds, priming_frame
from handoff.mcp.caller import Caller
from handoff.mcp.frames import encode_message
from handoff.mcp.handle import Exchange, McpSession, start

logger = logging.getLogger(__name__)
JSON_WAIT_SECONDS = 1.0
running: set[asyncio.Task] = set()


def run(
    request: types.JSONRPCRequest, session: McpSession, caller: Caller, stream: EventStream, reply_always: bool = False
) -> Exchange:
    """Start the request: its messages go into `stream` whether or not anyone reads them (straight from its
    handler's task: no queue and no task between them). Its exchange's scope stops it."""
    answered = False

    async def put(message: types.JSONRPCMessage) -> None:
        nonlocal answered
        if (data := encode_message(message)) is not None:
            answered = isinstance(message, types.JSONRPCResponse | types.JSONRPCError)
            stream.put(data, answered, message.error.code if isinstance(message, types.JSONRPCError) else None)

    def ended(task: asyncio.Task) -> None:
        running.discard(task)
        # The 2025-11-25 wire ends a request's stream only with a reply for its id, as the SDK's transport does.
        if reply_always and not answered:
            error = types.ErrorData(code=REQUEST_CANCELLED, message="Request cancelled")
            cancelled = types.JSONRPCError(jsonrpc="2.0", id=request.id, error=error)
            stream.put(encode_message(cancelled) or "", True, REQUEST_CANCELLED)
        stream.close()

    exchange, task = start(request, session, caller, put)
    running.add(task)  # the event loop keeps only weak references to tasks
    task.add_done_callback(ended)
    return exchange


async def answer(
    send: object,
    stream: EventStream,
    headers: Headers,
    status_of: Callable[[int | None], int],
    ready: Callable[[], object] | None = None,
    resumable: Callable[[EventStream], None] = EventStream.keep,
) -> bool:
    """Answer from `stream` as JSON (True) or start the SSE answer (False: the caller streams the rest).
    `ready` runs once the request's outcome is known well enough to go out."""
    first = await stream.first(min(JSON_WAIT_SECONDS, ping_seconds()))
    # A request the client cancelled ends its stream with REQUEST_CANCELLED (never as a JSON answer, which a
    # client that stopped waiting would take as an answer to deliver).
    if first is not None and first.final and first.code != REQUEST_CANCELLED:
        if ready is not None:
            await ready()
        await json_answer(send, status_of(first.code), first.data, headers)
        return True
    resumable(stream)
    await send({"type": "http.response.start", "status": 200, "headers": [*SSE, *headers]})
    return False


async def stream_out(send: object, stream: EventStream, after: int = 0, prime: bool = False) -> None:
    """The SSE body: a priming event when the stream is resumable, then its events after `after`."""
    if prime and (event_id := stream.event_id(after)) is not None:
        await send({"type": "http.response.body", "body": priming_frame(event_id), "more_body": True})
    async for frame in stream.frames(after, ping_seconds()):
        await send({"type": "http.response.body", "body": frame, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
