"""`/mcp` over Streamable HTTP: admission (host, origin, key, body size) in front of the SDK's transport,
which serves both protocol eras and hands every message to the dispatcher."""

import asyncio
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import replace
from typing import Any

from django.conf import settings
from mcp import types
from mcp.server.streamable_http import check_accept_headers
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request

from audit.telemetry import SESSIONS
from gateway_project.lib.process_task import ProcessTask
from handoff.mcp.audit_rows import refusal_record, session_record
from handoff.mcp.caller import Caller, Refused, caller_from_scope, header, host_allowed, origin_allowed
from handoff.mcp.frames import FrameError, parse_frame
from handoff.mcp.server import server
from handoff.mcp.sse_replay import RecentEvents
from handoff.protocol.moves import end_handoff
from handoff.snapshot import ConfigurationUnavailable
from handoff.web_process import background_start

# Host and Origin are checked here, against Django's settings, for every transport alike.
sdk_app = server.streamable_http_app(
    max_request_body_size=settings.GATEWAY_MAX_BODY_BYTES,
    session_idle_timeout=settings.GATEWAY_SESSION_IDLE_SECONDS,
    max_sessions=settings.GATEWAY_MAX_LEGACY_SESSIONS,
    transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    event_store=RecentEvents(settings.GATEWAY_SSE_REPLAY_EVENTS),
    retry_interval=settings.GATEWAY_SSE_RETRY_MS,
)


def live_session_ids() -> Collection[str]:
    """The sessions the SDK holds now. It closes idle ones on its own and tells nobody but its log, so its
    table is the one account that stays true (no public accessor exists)."""
    return server.session_manager._server_instances.keys()


SESSIONS.labels("http").set_function(lambda: len(live_session_ids()))
# How often sessions the SDK let expire are looked for: a fraction of the idle time, at most a minute.
REAP_SECONDS = min(60.0, max(0.5, settings.GATEWAY_SESSION_IDLE_SECONDS / 4))


# What a POST must accept, in both eras: the SDK's transports demand both types (this gateway streams replies),
# and its 2026-07-28 one refuses with an empty body.
NOT_ACCEPTABLE = "Not Acceptable: send 'Accept: application/json, text/event-stream'"


class BodyTooLarge(Exception):
    pass


async def _reject(
    send: Any, status: int, code: int, message: str, headers: list | None = None, request_id: Any = None
) -> None:
    body = FrameError(code, message, request_id).body().encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Any, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks)
        size += len(message.get("body", b""))
        if size > limit:
            raise BodyTooLarge
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _serve_sessions(ready: asyncio.Future) -> None:
    async with server.session_manager.run():
        ready.set_result(None)
        while True:
            await asyncio.sleep(REAP_SECONDS)
            for caller in owners.vanished(live_session_ids()):
                await _session_end(caller, "expired (idle)")


async def _session_end(caller: Caller, reason: str) -> None:
    await end_handoff(caller)
    await session_record(caller, "closed", reason=reason)


session_manager = ProcessTask(_serve_sessions)


class SessionOwners:
    """Who opened each 2025-11-25 session in this process. The SDK's session manager knows no principals:
    without this, any valid key could drive another agent's session if it learned the id. It is also how a
    session's end is recorded, whether the client deleted it or the SDK let it expire."""

    def __init__(self, capacity: int) -> None:
        self._owners: OrderedDict[str, Caller] = OrderedDict()
        self._capacity = capacity

    def claim(self, caller: Caller) -> None:
        self._owners[caller.session_id] = caller
        while len(self._owners) > self._capacity:
            self._owners.popitem(last=False)

    def may_use(self, session_id: str, caller: Caller) -> bool:
        owner = self._owners.get(session_id)
        return owner is None or owner.principal == caller.principal  # unknown ids are the SDK's to refuse

    def release(self, session_id: str) -> Caller | None:
        return self._owners.pop(session_id, None)

    def vanished(self, live: Collection[str]) -> list[Caller]:
        """The sessions claimed here that the SDK no longer holds, forgotten as they are returned."""
        gone = [session_id for session_id in self._owners if session_id not in live]
        return [self._owners.pop(session_id) for session_id in gone]

    def recording(self, send: Any, caller: Caller) -> Any:
        """`send`, noting (and auditing) the owner of a session id the response hands out."""

        async def send_and_claim(message: dict) -> None:
            if message["type"] == "http.response.start":
                for name, value in message.get("headers", []):
                    if name.lower() == b"mcp-session-id":
                        opened = replace(caller, session_id=value.decode("latin-1"))
                        self.claim(opened)
                        await session_record(opened, "opened")
            await send(message)

        return send_and_claim


owners = SessionOwners(settings.GATEWAY_MAX_LEGACY_SESSIONS)


async def mcp_http_app(scope: dict, receive: Any, send: Any) -> None:
    if not host_allowed(scope):
        return await _reject(send, 400, types.INVALID_REQUEST, "Host not allowed")
    if not origin_allowed(scope):
        return await _reject(send, 403, types.INVALID_REQUEST, "Origin not allowed")
    try:
        caller = await caller_from_scope(scope, "http")
    except ConfigurationUnavailable as exc:
        return await _reject(send, 503, exc.error.code, exc.error.message, [(b"retry-after", b"1")])
    except Refused as refused:
        await refusal_record("http", refused)
        headers = [(b"www-authenticate", refused.challenge.encode())]
        return await _reject(send, refused.status, types.INVALID_REQUEST, refused.message, headers)
    if scope["method"] == "POST" and not all(check_accept_headers(Request(scope))):
        return await _reject(send, 406, types.INVALID_REQUEST, NOT_ACCEPTABLE)
    limit = settings.GATEWAY_MAX_BODY_BYTES
    declared = header(scope, b"content-length")
    try:
        if declared and declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge
        body = await _read_body(receive, limit) if scope["method"] == "POST" else b""
        if body:
            parse_frame(body)
    except BodyTooLarge:
        return await _reject(send, 413, types.INVALID_REQUEST, f"Request body over {limit} bytes")
    except FrameError as exc:
        return await _reject(send, 400, exc.code, exc.message, request_id=exc.request_id)
    session_id = header(scope, b"mcp-session-id")
    if session_id and not owners.may_use(session_id, caller):
        # The same answer as for an id that does not exist: nothing tells the caller whose it is.
        return await _reject(send, 404, types.INVALID_REQUEST, "Session not found")
    scope["switchboard.caller"] = caller
    await session_manager.ensure_running()
    background_start()
    replayed = _replay(body, receive) if scope["method"] == "POST" else receive
    await sdk_app(scope, replayed, owners.recording(send, caller) if not session_id else send)
    if scope["method"] == "DELETE" and session_id and (owner := owners.release(session_id)):
        await _session_end(owner, "deleted by the client")


def _replay(body: bytes, receive: Any) -> Any:
    sent = False

    async def replayed() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
