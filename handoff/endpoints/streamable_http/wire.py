"""What `/mcp` puts on the wire: JSON answers, error answers, SSE frames, and the wait for a client to go."""

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any

from django.conf import settings

from handoff.mcp.frames import FrameError

Headers = Iterable[tuple[bytes, bytes]]
JSON = (b"content-type", b"application/json")
SSE = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),  # nginx would otherwise hold the stream back in its buffer
]
PING = b": ping\r\n\r\n"


def ping_seconds() -> float:
    """How long a stream stays silent before a comment line keeps proxies from timing it out."""
    return settings.GATEWAY_SSE_PING_SECONDS


def sse_frame(data: str, event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\r\n" if event_id is not None else ""
    return f"{head}event: message\r\ndata: {data}\r\n\r\n".encode()


def priming_frame(event_id: str) -> bytes:
    """An event with an id and no data, first on a resumable stream: a client that loses the stream before
    anything else comes can still resume it, after the `retry` it is told."""
    return f"id: {event_id}\r\nretry: {settings.GATEWAY_SSE_RETRY_MS}\r\ndata: \r\n\r\n".encode()


async def json_answer(send: Any, status: int, body: str | bytes, headers: Headers = ()) -> None:
    data = body.encode() if isinstance(body, str) else body
    # Its length said: the server sends the body as it is, not chunked (framing the client has to take apart).
    length = (b"content-length", str(len(data)).encode())
    await send({"type": "http.response.start", "status": status, "headers": [JSON, length, *headers]})
    await send({"type": "http.response.body", "body": data})


async def error_answer(
    send: Any, status: int, code: int, message: str, headers: Headers = (), request_id: Any = None
) -> None:
    await json_answer(send, status, FrameError(code, message, request_id).body(), headers)


async def empty_answer(send: Any, status: int, headers: Headers = ()) -> None:
    # Its length said (none), as a JSON answer's: else the server frames nothing as a chunked body.
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0"), *headers]})
    await send({"type": "http.response.body", "body": b""})


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_gone(receive: Any, work: Awaitable[None], stop: asyncio.Event | None = None) -> bool:
    """Run `work` (a streaming answer) until it ends, or until the client goes or `stop` is set (it is
    cancelled then). True if `stop` ended it: the answer is the caller's to end."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(receive))
    stopping = asyncio.ensure_future(stop.wait()) if stop is not None else None
    waits = (task, gone, stopping) if stopping is not None else (task, gone)
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    if not task.cancelled() and (exc := task.exception()) is not None:
        raise exc
    return task.cancelled() and stopping is not None and stopping.done() and not stopping.cancelled()
