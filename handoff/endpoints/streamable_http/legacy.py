"""2025-11-25 over Streamable HTTP: `initialize` opens a session (its id in `Mcp-Session-Id`), POSTs carry
its messages, a GET reads what the session is sent outside any request (or resumes a broken stream from its
`Last-Event-ID`), DELETE ends it. A client's disconnect does not cancel its request (the era's rule): the
request runs on into its stream, for the client to resume. With Redis the sessions are in Redis and any web
process serves any of them (redis_sessions.py); without, in this process (sessions.py)."""

import asyncio
import json
import logging
from dataclasses import replace
from typing import Any

from django.conf import settings
from mcp import types
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params
from mcp_types.version import is_version_at_least

from audit.telemetry import SESSIONS
from gateway_project.lib import redis_clients
from gateway_project.lib.process_task import ProcessTask
from handoff.endpoints.probes import drain
from handoff.endpoints.streamable_http import exchange
from handoff.endpoints.streamable_http.redis_sessions import RedisSessions
from handoff.endpoints.streamable_http.sessions import NOT_FOUND, HttpSession, LocalSessions
from handoff.endpoints.streamable_http.wire import SSE, empty_answer, error_answer, json_answer, sse_frame, until_gone
from handoff.mcp.audit_rows import session_record, unserved_record
from handoff.mcp.caller import Caller, header
from handoff.mcp.frames import encode_message, retry_later
from handoff.mcp.handle import handle
from handoff.mcp.list_changed import relay_everywhere, relay_handlers
from handoff.protocol.moves import end_handoff
from handoff.session_limit import STATE_UNAVAILABLE, UNAVAILABLE, SessionsFull, session_limit
from policy.decisions import RETRY_LATER

logger = logging.getLogger(__name__)
Store = RedisSessions if settings.REDIS_URL else LocalSessions
sessions = Store(
    settings.GATEWAY_MAX_LEGACY_SESSIONS,
    session_limit,
    settings.GATEWAY_SESSION_IDLE_SECONDS,
    settings.GATEWAY_SSE_REPLAY_EVENTS,
)
SESSIONS.labels("http").set_function(lambda: len(sessions))
# How often idle sessions are looked for: a fraction of the idle time, at most a minute.
REAP_SECONDS = min(60.0, max(0.5, settings.GATEWAY_SESSION_IDLE_SECONDS / 4))
RESUMABLE = "2025-11-25"  # older clients cannot read a priming event (an id with no data)
# Requests after which the session's record is written again: they change what it holds (the handshake's
# record is written as `initialize` is answered).
CHANGING = frozenset({"logging/setLevel"})
RELAYED = "mcp.session.message"  # a client's message for a session, passed to the process that waits for it


async def _reap(ready: asyncio.Future) -> None:
    ready.set_result(None)
    while True:
        await asyncio.sleep(REAP_SECONDS)
        async for session in sessions.expired():
            await _end(session, "expired (idle)")


reaper = ProcessTask(_reap)


async def _end(session: HttpSession, reason: str) -> None:
    await session.close()
    await end_handoff(session.owner)
    await session_record(session.owner, "closed", reason=reason)


def _checked_at_admission(message: types.JSONRPCMessage | None) -> bool:
    """Whether the request's admission checks its session's state (handoff/mcp/unverified.py): a tools/call
    answered within the request (one made as a task may run on after it)."""
    if not isinstance(message, types.JSONRPCRequest) or message.method != "tools/call":
        return False
    return isinstance(message.params, dict) and "task" not in message.params


async def serve(scope: dict, receive: Any, send: Any, caller: Caller, message: types.JSONRPCMessage | None) -> None:
    """One HTTP request of a 2025-11-25 client; `message` is a POST's, parsed and checked. Without the session
    store (Redis down) it is refused, said in the audit trail, and the process serves on."""
    started = False

    async def watched(event: dict) -> None:
        nonlocal started
        started = started or event["type"] == "http.response.start"
        await send(event)

    try:
        await _serve(scope, receive, watched, caller, message)
    except redis_clients.RedisError as exc:
        logger.error("2025-11-25 session store unavailable: %s", exc)
        if started:  # the answer went out before the store failed (saving after it): nothing more to say
            return
        session_id = header(scope, b"mcp-session-id") or ""
        method = getattr(message, "method", "") or scope["method"]
        await unserved_record(replace(caller, session_id=session_id), STATE_UNAVAILABLE, UNAVAILABLE, method=method)
        await _retry_later(send, 503, getattr(message, "id", None), STATE_UNAVAILABLE, UNAVAILABLE, 1)


async def _retry_later(send: Any, status: int, request_id: Any, code: str, message: str, seconds: int) -> None:
    """A request not served now that may be later: -32003 with its `code`, and when, in the body and header."""
    body = retry_later(code, message, seconds, request_id)
    await json_answer(send, status, body, [(b"retry-after", str(seconds).encode())])


async def _serve(scope: dict, receive: Any, send: Any, caller: Caller, message: types.JSONRPCMessage | None) -> None:
    await reaper.ensure_running()
    session_id = header(scope, b"mcp-session-id")
    if session_id is None:
        if isinstance(message, types.JSONRPCRequest) and message.method == "initialize":
            return await _open(receive, send, caller, message)
        return await error_answer(send, 400, types.INVALID_REQUEST, "Bad Request: Missing session ID")
    session = await sessions.get(session_id, caller, unread=_checked_at_admission(message))
    if session is None:
        return await error_answer(send, 404, types.INVALID_REQUEST, NOT_FOUND)
    version = header(scope, b"mcp-protocol-version")
    if version is not None and session.version and version != session.version:
        why = f"Bad Request: MCP-Protocol-Version {version} is not this session's ({session.version})"
        return await error_answer(send, 400, types.INVALID_REQUEST, why)
    session.touch()
    session.busy += 1
    try:
        if message is not None:
            await _post(receive, send, session, replace(caller, session_id=session.id), message)
        elif scope["method"] == "GET":
            await _get(scope, receive, send, session)
        else:
            await sessions.pop(session)
            await _end(session, "deleted by the client")
            await empty_answer(send, 200, [(b"mcp-session-id", session.id.encode())])
    finally:
        session.busy -= 1
        session.touch()


async def _open(receive: Any, send: Any, caller: Caller, message: types.JSONRPCRequest) -> None:
    try:
        session = await sessions.open(caller)
    except SessionsFull as full:
        if not full.code:  # the process is full: nothing of the caller's to say
            retry = [(b"retry-after", str(full.retry_after).encode())]
            return await error_answer(send, full.status, RETRY_LATER, full.message, retry, request_id=message.id)
        await unserved_record(caller, full.code, full.message, method="initialize")
        return await _retry_later(send, full.status, message.id, full.code, full.message, full.retry_after)

    async def opened() -> None:
        if session.mcp.connection.initialize_accepted:
            session.version = session.mcp.connection.protocol_version
            await sessions.save(session)
            await session_record(session.owner, "opened")

    session.busy += 1
    try:
        await _post(receive, send, session, session.owner, message, opened)
    finally:
        session.busy -= 1
        session.touch()
    if not session.version:  # refused, failed or cancelled: nothing was established
        await sessions.pop(session)
        await session.close()


async def _post(
    receive: Any, send: Any, session: HttpSession, caller: Caller, message: types.JSONRPCMessage, ready=None
) -> None:
    headers = [(b"mcp-session-id", session.id.encode())]
    if not isinstance(message, types.JSONRPCRequest):
        # Handled before the 202, so that what a client sends next finds it done (`notifications/initialized`).
        if isinstance(sessions, RedisSessions) and not _waited_for_here(session, message):
            await relay_everywhere({"type": RELAYED, "session": session.id, "message": encode_message(message)})
        else:
            async for _ in handle(message, session.mcp, caller):
                pass
        return await empty_answer(send, 202, headers)
    stream = session.streams.stream()
    exchange.run(message, session.mcp, caller, stream, reply_always=True)

    def status(code: int | None) -> int:
        # The era answers a JSON-RPC error with 200, as any reply; a session its call found ended (its state was
        # checked by the call, handoff/mcp/unverified.py) as the door does.
        return 404 if code == types.INVALID_REQUEST and session.ended else 200

    if await exchange.answer(send, stream, headers, status, ready, session.streams.resumable):
        return await _saved_after(session, message)
    prime = is_version_at_least(session.version or message_version(message), RESUMABLE)
    await until_gone(receive, exchange.stream_out(send, stream, prime=prime))
    if ready is not None and stream.done:
        await ready()
    await _saved_after(session, message)


async def _saved_after(session: HttpSession, message: types.JSONRPCRequest) -> None:
    if message.method in CHANGING and session.version:
        await sessions.save(session)


def _waited_for_here(session: HttpSession, message: types.JSONRPCMessage) -> bool:
    """Whether this process holds what a client's answer or cancellation is for (or it is for nobody)."""
    if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
        return coerce_request_id(message.id) in session.mcp.asked
    if isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
        request_id = cancelled_request_id_from_params(message.params)
        return request_id is None or coerce_request_id(request_id) in session.mcp.running
    return True


async def _relayed(relayed: dict) -> None:
    """A client's message that reached another process, for a session this one may be waiting in."""
    session = sessions.held(relayed["session"])
    if session is not None and relayed.get("message"):
        message = types.jsonrpc_message_adapter.validate_json(relayed["message"])
        if _waited_for_here(session, message):
            async for _ in handle(message, session.mcp, session.owner):
                pass


relay_handlers[RELAYED] = _relayed


def message_version(message: types.JSONRPCRequest) -> str:
    version = (message.params or {}).get("protocolVersion") if message.method == "initialize" else None
    return version if isinstance(version, str) else RESUMABLE


async def _get(scope: dict, receive: Any, send: Any, session: HttpSession) -> None:
    if b"text/event-stream" not in (header(scope, b"accept") or "").encode():
        return await error_answer(
            send, 406, types.INVALID_REQUEST, "Not Acceptable: a GET must accept text/event-stream"
        )
    resume = header(scope, b"last-event-id")
    found = await session.streams.reader(resume)
    if found is None:
        return await error_answer(
            send, 404, types.INVALID_REQUEST, "Not Found: Last-Event-ID names no stream of this session"
        )
    stream, after, own = found
    if own:
        if session.listening:
            return await error_answer(send, 409, types.INVALID_REQUEST, "Conflict: the session has a GET stream open")
        session.listening = True
    try:
        headers = [*SSE, (b"mcp-session-id", session.id.encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if missed := await stream.missed(after):
            await send({"type": "http.response.body", "body": _missed(missed), "more_body": True})
        prime = is_version_at_least(session.version, RESUMABLE)
        # A draining process ends its GET streams: their clients come back after the retry hint, with their
        # Last-Event-ID, to another process (sessions in Redis), instead of holding this one up.
        if await until_gone(receive, exchange.stream_out(send, stream, after, prime), drain.started):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        if own:
            session.listening = False


def _missed(count: int) -> bytes:
    """Said on a resumed stream whose oldest events the replay bound pushed out before the client came back."""
    said = (
        f"{count} events of this stream were dropped before it was resumed: the gateway keeps the newest "
        f"{settings.GATEWAY_SSE_REPLAY_EVENTS} (GATEWAY_SSE_REPLAY_EVENTS)"
    )
    notice = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "warning", "data": said}}
    return sse_frame(json.dumps(notice))
