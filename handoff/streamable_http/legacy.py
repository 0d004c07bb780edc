"""2025-11-25 over Streamable HTTP: `initialize` opens a session (its id in `Mcp-Session-Id`), POSTs carry
its messages, a GET reads what the session is sent outside any request (or resumes a broken stream from its
`Last-Event-ID`), DELETE ends it. A client's disconnect does not cancel its request (the era's rule): the
request runs on into its stream, for the client to resume."""

import asyncio
import json
from typing import Any

from django.conf import settings
from mcp import types
from mcp_types.version import is_version_at_least

from audit.telemetry import SESSIONS
from gateway_project.lib.process_task import ProcessTask
from handoff.mcp.audit_rows import session_record
from handoff.mcp.caller import Caller, header
from handoff.mcp.handle import handle
from handoff.protocol.moves import end_handoff
from handoff.streamable_http import exchange
from handoff.streamable_http.sessions import HttpSession, LocalSessions
from handoff.streamable_http.wire import SSE, empty_answer, error_answer, sse_frame, until_gone

sessions = LocalSessions(
    settings.GATEWAY_MAX_LEGACY_SESSIONS, settings.GATEWAY_SESSION_IDLE_SECONDS, settings.GATEWAY_SSE_REPLAY_EVENTS
)
SESSIONS.labels("http").set_function(lambda: len(sessions))
# How often idle sessions are looked for: a fraction of the idle time, at most a minute.
REAP_SECONDS = min(60.0, max(0.5, settings.GATEWAY_SESSION_IDLE_SECONDS / 4))
RESUMABLE = "2025-11-25"  # older clients cannot read a priming event (an id with no data)


async def _reap(ready: asyncio.Future) -> None:
    ready.set_result(None)
    while True:
        await asyncio.sleep(REAP_SECONDS)
        for session in sessions.expired():
            await _end(session, "expired (idle)")


reaper = ProcessTask(_reap)


async def _end(session: HttpSession, reason: str) -> None:
    await session.close()
    await end_handoff(session.owner)
    await session_record(session.owner, "closed", reason=reason)


def _always_ok(code: int | None) -> int:
    return 200  # the era answers a JSON-RPC error with 200, as any reply


async def serve(scope: dict, receive: Any, send: Any, caller: Caller, message: types.JSONRPCMessage | None) -> None:
    """One HTTP request of a 2025-11-25 client; `message` is a POST's, parsed and checked."""
    await reaper.ensure_running()
    session_id = header(scope, b"mcp-session-id")
    if session_id is None:
        if isinstance(message, types.JSONRPCRequest) and message.method == "initialize":
            return await _open(receive, send, caller, message)
        return await error_answer(send, 400, types.INVALID_REQUEST, "Bad Request: Missing session ID")
    session = sessions.get(session_id, caller)
    if session is None:
        return await error_answer(send, 404, types.INVALID_REQUEST, "Session not found")
    version = header(scope, b"mcp-protocol-version")
    if version is not None and session.version and version != session.version:
        why = f"Bad Request: MCP-Protocol-Version {version} is not this session's ({session.version})"
        return await error_answer(send, 400, types.INVALID_REQUEST, why)
    session.touch()
    session.busy += 1
    try:
        if message is not None:
            await _post(receive, send, session, message)
        elif scope["method"] == "GET":
            await _get(scope, receive, send, session)
        else:
            sessions.pop(session.id)
            await _end(session, "deleted by the client")
            await empty_answer(send, 200, [(b"mcp-session-id", session.id.encode())])
    finally:
        session.busy -= 1
        session.touch()


async def _open(receive: Any, send: Any, caller: Caller, message: types.JSONRPCRequest) -> None:
    session = sessions.open(caller)
    if session is None:
        return await error_answer(
            send, 503, types.INTERNAL_ERROR, "Too many open sessions: try again later", [(b"retry-after", b"5")]
        )

    async def opened() -> None:
        if session.mcp.connection.initialize_accepted:
            session.version = session.mcp.connection.protocol_version
            await session_record(session.owner, "opened")

    session.busy += 1
    try:
        await _post(receive, send, session, message, opened)
    finally:
        session.busy -= 1
        session.touch()
    if not session.version:  # refused, failed or cancelled: nothing was established
        sessions.pop(session.id)
        await session.close()


async def _post(receive: Any, send: Any, session: HttpSession, message: types.JSONRPCMessage, ready=None) -> None:
    headers = [(b"mcp-session-id", session.id.encode())]
    if not isinstance(message, types.JSONRPCRequest):
        # Handled before the 202, so that what a client sends next finds it done (`notifications/initialized`).
        async for _ in handle(message, session.mcp, session.owner):
            pass
        return await empty_answer(send, 202, headers)
    stream = session.stream()
    exchange.run(message, handle(message, session.mcp, session.owner), stream, reply_always=True)
    if await exchange.answer(send, stream, headers, _always_ok, ready, session.resumable):
        return
    prime = is_version_at_least(session.version or message_version(message), RESUMABLE)
    await until_gone(receive, exchange.stream_out(send, stream, prime=prime))
    if ready is not None and stream.done:
        await ready()


def message_version(message: types.JSONRPCRequest) -> str:
    version = (message.params or {}).get("protocolVersion") if message.method == "initialize" else None
    return version if isinstance(version, str) else RESUMABLE


async def _get(scope: dict, receive: Any, send: Any, session: HttpSession) -> None:
    if b"text/event-stream" not in (header(scope, b"accept") or "").encode():
        return await error_answer(
            send, 406, types.INVALID_REQUEST, "Not Acceptable: a GET must accept text/event-stream"
        )
    resume = header(scope, b"last-event-id")
    found = session.find(resume) if resume else (session.own, session.own.count)
    if found is None:
        return await error_answer(
            send, 404, types.INVALID_REQUEST, "Not Found: Last-Event-ID names no stream of this session"
        )
    stream, after = found
    if stream is session.own:
        if session.listening:
            return await error_answer(send, 409, types.INVALID_REQUEST, "Conflict: the session has a GET stream open")
        session.listening = True
    try:
        await send(
            {"type": "http.response.start", "status": 200, "headers": [*SSE, (b"mcp-session-id", session.id.encode())]}
        )
        if missed := stream.missed(after):
            await send({"type": "http.response.body", "body": _missed(missed), "more_body": True})
        prime = is_version_at_least(session.version, RESUMABLE)
        await until_gone(receive, exchange.stream_out(send, stream, after, prime))
    finally:
        if stream is session.own:
            session.listening = False


def _missed(count: int) -> bytes:
    """Said on a resumed stream whose oldest events the replay bound pushed out before the client came back."""
    said = (
        f"{count} events of this stream were dropped before it was resumed: the gateway keeps the newest "
        f"{settings.GATEWAY_SSE_REPLAY_EVENTS} (GATEWAY_SSE_REPLAY_EVENTS)"
    )
    notice = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "warning", "data": said}}
    return sse_frame(json.dumps(notice))
