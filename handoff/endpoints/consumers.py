"""`/mcp/ws`: JSON-RPC over WebSocket (not an MCP transport in the spec; served for clients that speak
it). The consumer admits and frames; every message goes to the MCP layer's `handle` (handoff/mcp/handle.py),
each request in a task of its own so that a cancellation, or the agent's answer to a question, can overtake
it."""

import asyncio
import json
import logging
import time
import uuid
from dataclasses import replace

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from mcp import types
from pydantic import ValidationError

from gateway_project.lib import redis_clients
from gateway_project.lib.task_failures import failure_logger
from handoff.mcp.audit_rows import refusal_record, session_record, unserved_record
from handoff.mcp.caller import Caller, Refused, caller_from_scope, host_allowed, origin_allowed, signed_out
from handoff.mcp.frames import FrameError, encode_message, frame_id, parse_frame, retry_later
from handoff.mcp.handle import McpSession, handle
from handoff.mcp.list_changed import session_forget
from handoff.protocol.moves import end_handoff
from handoff.session_limit import STATE_UNAVAILABLE, UNAVAILABLE, SessionsFull, session_limit
from handoff.snapshot import ConfigurationUnavailable, snapshot
from handoff.web_process import background_start

# Application close codes (Daphne passes 1000 and 3000-4999): 4000 + the HTTP status a request would get.
SIGNED_OUT_CLOSE = 4401
SESSION_LIMIT_CLOSE = 4429
STATE_UNAVAILABLE_CLOSE = 4503
logger = logging.getLogger(__name__)


# The session's tasks are awaited only at disconnect: without this their failures would go unseen.
_log_failure = failure_logger(logger, "websocket session task")


class McpWebSocketConsumer(AsyncWebsocketConsumer):
    caller: Caller
    session: McpSession | None = None
    _watching: asyncio.Task | None = None
    _last_frame = 0.0
    _signed_out = ""
    _requests: set[asyncio.Task]  # the client's requests not answered yet

    async def connect(self) -> None:
        caller = None
        if host_allowed(self.scope) and origin_allowed(self.scope):
            try:
                caller = await caller_from_scope(self.scope, "ws")
            except ConfigurationUnavailable as exc:
                error = {"code": exc.error.code, "message": exc.error.message, "data": exc.error.data}
                return await self._refuse(json.dumps({"jsonrpc": "2.0", "id": None, "error": error}))
            except Refused as refused:
                await refusal_record("ws", refused)
        if caller is None:
            await self.close()  # before accept: the handshake is answered 403
            return
        self.caller = replace(caller, session_id=f"ws-{uuid.uuid4().hex}")
        try:
            await session_limit.admit(self.caller)
        except SessionsFull as full:
            await unserved_record(self.caller, full.code, full.message)
            return await self._refuse(retry_later(full.code, full.message, full.retry_after), SESSION_LIMIT_CLOSE)
        except redis_clients.RedisError as exc:
            logger.error("WebSocket session not counted, Redis unavailable: %s", exc)
            await unserved_record(self.caller, STATE_UNAVAILABLE, UNAVAILABLE)
            return await self._refuse(retry_later(STATE_UNAVAILABLE, UNAVAILABLE, 1), STATE_UNAVAILABLE_CLOSE)
        background_start()
        await self.accept()
        await session_record(self.caller, "opened")
        self.session = McpSession(self._deliver, id=self.caller.session_id)
        self._last_frame = time.monotonic()
        self._requests = set()
        self._watching = asyncio.create_task(self._close_when_idle())
        self._watching.add_done_callback(_log_failure)

    async def _refuse(self, body: str, code: int = 1000) -> None:
        """A socket not served for now (no configuration to check the key against in a new process while the
        database is down, too many sessions, Redis down): the handshake is accepted only to say why, since a
        refused one reads as 403 (and an exception as 500)."""
        await self.accept()
        await self.send(text_data=body)
        await self.close(code=code)

    async def _close_when_idle(self) -> None:
        """A socket with no request pending and no frame either way for GATEWAY_SESSION_IDLE_SECONDS is
        closed, as a normal closure: Daphne accepts only 1000 or 3000-4999 from an application."""
        idle = settings.GATEWAY_SESSION_IDLE_SECONDS
        while self._requests or (left := self._last_frame + idle - time.monotonic()) > 0:
            await asyncio.sleep(idle if self._requests else left)
        await self.close(code=1000, reason="idle")

    async def _deliver(self, message: types.JSONRPCMessage) -> None:
        self._last_frame = time.monotonic()
        if (frame := encode_message(message)) is not None:
            await self.send(text_data=frame)

    async def _handle(self, message: types.JSONRPCMessage) -> None:
        async for reply in handle(message, self.session, self.caller):
            await self._deliver(reply)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        self._last_frame = time.monotonic()
        raw = text_data if text_data is not None else (bytes_data or b"").decode("utf-8", "replace")
        if len(raw.encode("utf-8", "surrogatepass")) > settings.GATEWAY_MAX_BODY_BYTES:
            return await self.send(
                text_data=FrameError(
                    types.INVALID_REQUEST, f"Message over {settings.GATEWAY_MAX_BODY_BYTES} bytes"
                ).body()
            )
        try:
            payload = parse_frame(raw)
            message = types.jsonrpc_message_adapter.validate_python(payload, by_name=False)
        except FrameError as exc:
            return await self.send(text_data=exc.body())
        except ValidationError:
            return await self.send(
                text_data=FrameError(
                    types.INVALID_REQUEST,
                    "Invalid Request: the message does not match any JSON-RPC 2.0 shape",
                    frame_id(payload),
                ).body()
            )
        if why := signed_out(self.caller, snapshot.latest):
            return await self._sign_out(why, frame_id(payload))
        if not isinstance(message, types.JSONRPCRequest) or message.method == "initialize":
            return await self._handle(message)  # in order: the handshake commits before the next frame is read
        task = asyncio.create_task(self._handle(message), name=f"request {message.id!r}")
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)
        task.add_done_callback(_log_failure)

    async def _sign_out(self, why: str, request_id: str | int | None) -> None:
        """The person the socket was opened for may not go on (their token ran out, or an admin disabled
        them): nothing more is served on it."""
        self._signed_out = why
        await self.send(text_data=FrameError(types.INVALID_REQUEST, why, request_id).body())
        await self.close(code=SIGNED_OUT_CLOSE, reason="signed out")

    async def disconnect(self, code: int) -> None:
        if self.session is None:
            return
        tasks = [task for task in (*self._requests, self._watching) if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.session.close()
        session_forget(self.caller)  # what the MCP layer kept of the socket's session holds this consumer too
        await end_handoff(self.caller)
        try:
            await session_limit.release(self.caller)
        except redis_clients.RedisError as exc:  # its place frees itself once the idle time has passed
            logger.warning("WebSocket session %s not uncounted, Redis unavailable: %s", self.caller.session_id, exc)
        reason = self._signed_out or f"socket closed ({code})"
        await session_record(self.caller, "closed", reason=reason)
