"""The MCP layer's one entry, the same for every transport: `handle(message, session, caller)` yields the
messages to send back for one message from the agent. A transport frames, admits and delivers; this fixes the
session's era, runs the method through the SDK's handler kernel (`ServerRunner`: typed params, the handshake
gate, result shaping) over the gateway's handler table (server.py), and answers. No SDK session loop and no
streams underneath: what a handler sends while it runs (progress, logs, an upstream's question for the agent)
comes out of the same iterator ahead of the reply, and the agent's answer to a question comes back in through
`handle` like any other message. `start` runs a request the same way for a transport with a queue of its own
(/mcp's event streams): its messages go straight there, without `handle`'s iterator."""

import asyncio
import itertools
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from mcp import types
from mcp.server.connection import Connection, NotifyOnlyOutbound
from mcp.server.runner import ServerRunner, aclose_shielded, modern_error_data
from mcp.shared.dispatcher import CallOptions, coerce_request_id
from mcp.shared.exceptions import MCPError, NoBackChannelError
from mcp.shared.inbound import InboundLadderRejection, classify_inbound_request
from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params, progress_token_from_params
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types import PROTOCOL_VERSION_META_KEY, UnsupportedProtocolVersionErrorData
from mcp_types.version import LATEST_MODERN_VERSION, MODERN_PROTOCOL_VERSIONS

from gateway_project.lib.task_failures import failure_logger
from handoff.mcp.caller import Caller, answering
from handoff.mcp.server import server

logger = logging.getLogger(__name__)
Push = Callable[[types.JSONRPCMessage], Awaitable[None]]
# How many messages one request may have waiting for its transport before its handler waits in turn.
BACKLOG = 64
LEGACY, MODERN = "2025-11-25", "2026-07-28"  # the eras, by the first version of each
CONNECTION_CLOSED = types.ErrorData(code=types.CONNECTION_CLOSED, message="Connection closed")


class Standalone:
    """The session's own channel, for what is sent outside any request (a list change). The gateway asks the
    agent only within a request, where the question and its answer share the request's stream."""

    def __init__(self, push: Push) -> None:
        self._push = push

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None) -> None:
        await self._push(types.JSONRPCNotification(jsonrpc="2.0", method=method, params=params))

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> dict[str, Any]:
        raise NoBackChannelError(method)


@dataclass(eq=False)
class McpSession:
    """One agent's session as the MCP layer holds it: its era (fixed by its first request, as the SDK's
    dual-era loop fixes it), its handshake state, the requests running (to cancel) and the questions it
    asked the agent (to answer). `push` is the transport's channel for messages outside any request."""

    push: Push
    id: str | None = None
    era: str = ""
    running: dict[Any, "Exchange"] = field(default_factory=dict)
    asked: dict[Any, MemoryObjectSendStream] = field(default_factory=dict)
    # The ids of its questions to the agent: unique across the processes that may serve the same session.
    _ids: Any = field(default_factory=lambda: (f"{secrets.token_hex(4)}-{n}" for n in itertools.count(1)))

    def __post_init__(self) -> None:
        self.standalone = Standalone(self.push)

    @cached_property
    def connection(self) -> Connection:
        """The handshake's state; a 2026-07-28 session, whose requests each bring their own, never makes it."""
        return Connection.for_loop(self.standalone, session_id=self.id)

    @cached_property
    def runner(self) -> ServerRunner:
        return ServerRunner(server, self.connection, None)

    def handshake(self) -> dict[str, Any]:
        """What the handshake settled, as JSON values: what a process that did not see it needs to serve the
        session (`resume`)."""
        params = self.connection.client_params
        return {
            "version": self.connection.protocol_version,
            "client": params.model_dump(mode="json", by_alias=True, exclude_none=True) if params else None,
        }

    def resume(self, handshake: dict[str, Any]) -> None:
        """Take up a session whose handshake another process served (its `handshake()`)."""
        client = handshake["client"]
        connection = Connection(
            self.standalone,
            protocol_version=handshake["version"],
            session_id=self.id,
            client_params=types.InitializeRequestParams.model_validate(client) if client else None,
        )
        connection.initialized.set()
        self.__dict__["connection"] = connection
        self.__dict__.pop("runner", None)
        self.era = LEGACY

    async def ask(self, send: Push, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
        """Put a question to the agent on a request's stream and wait for its answer (or the session's end)."""
        request_id = next(self._ids)
        answers, answer = anyio.create_memory_object_stream[dict[str, Any] | types.ErrorData](1)
        self.asked[request_id] = answers
        try:
            await send(types.JSONRPCRequest(jsonrpc="2.0", id=request_id, method=method, params=params))
            outcome = await answer.receive()
        except anyio.get_cancelled_exc_class():
            with anyio.move_on_after(1, shield=True):  # the agent may stop asking its person
                cancel = {"requestId": request_id, "reason": "the call it was asked for has ended"}
                await send(types.JSONRPCNotification(jsonrpc="2.0", method="notifications/cancelled", params=cancel))
            raise
        finally:
            self.asked.pop(request_id, None)
            answers.close()
            answer.close()
        if isinstance(outcome, types.ErrorData):
            raise MCPError.from_error_data(outcome)
        return outcome

    def answered(self, message: types.JSONRPCResponse | types.JSONRPCError) -> None:
        answers = self.asked.get(coerce_request_id(message.id))
        if answers is None:
            logger.debug("dropped an answer to %r, which nothing is waiting for", message.id)
            return
        outcome = message.result if isinstance(message, types.JSONRPCResponse) else message.error
        try:
            answers.send_nowait(outcome)
        except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
            logger.debug("dropped a second answer to %r", message.id)

    def cancel(self, request_id: Any) -> None:
        """The agent cancelled a request: it runs no further and is never answered (the spec's rule)."""
        if request_id is not None and (exchange := self.running.get(coerce_request_id(request_id))) is not None:
            exchange.cancel_requested.set()
            exchange.scope.cancel()

    async def close(self) -> None:
        """The transport is gone: stop what runs, release what waits, unwind the handshake's connection."""
        for exchange in list(self.running.values()):
            exchange.scope.cancel()
        for answers in list(self.asked.values()):
            try:
                answers.send_nowait(CONNECTION_CLOSED)
            except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # answered already, or no longer waited for
        if "connection" in self.__dict__:
            await aclose_shielded(self.connection)


@dataclass(eq=False, slots=True)  # slots and a lazy event: a call held for sign-off keeps its exchange
class Exchange:
    """One message's back channel (the SDK's `DispatchContext`): what its handler sends goes out on `send`,
    ahead of the reply. Only a request of a 2025-11-25 session may ask the agent a question."""

    session: McpSession
    request_id: Any
    send: Push
    transport: TransportContext
    message_metadata: ServerMessageMetadata
    progress_token: Any = None
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    closed: bool = False
    _cancel: anyio.Event | None = None  # made once asked for: most requests are never cancelled

    @property
    def cancel_requested(self) -> anyio.Event:
        if self._cancel is None:
            self._cancel = anyio.Event()
        return self._cancel

    @property
    def can_send_request(self) -> bool:
        return self.transport.can_send_request and not self.closed

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None) -> None:
        if not self.closed:
            await self.send(types.JSONRPCNotification(jsonrpc="2.0", method=method, params=params))

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> dict[str, Any]:
        if not self.can_send_request:
            raise NoBackChannelError(method)
        return await self.session.ask(self.send, method, params)

    async def progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        if self.progress_token is None:
            return
        params = {"progressToken": self.progress_token, "progress": progress, "total": total, "message": message}
        await self.notify("notifications/progress", {k: v for k, v in params.items() if v is not None})


def _enveloped(params: Mapping[str, Any] | None) -> bool:
    """Whether a request carries the 2026-07-28 envelope (its reserved version key says so on its own)."""
    meta = (params or {}).get("_meta")
    return isinstance(meta, Mapping) and PROTOCOL_VERSION_META_KEY in meta


def _exchange(session: McpSession, caller: Caller, send: Push, request_id: Any = None, params: Any = None) -> Exchange:
    asks = session.era == LEGACY and request_id is not None
    return Exchange(
        session,
        request_id,
        send,
        TransportContext(kind=caller.transport, can_send_request=asks),
        ServerMessageMetadata(request_context=caller),
        progress_token_from_params(params),
    )


async def _legacy(exchange: Exchange, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    if method != "initialize" and _enveloped(params):
        raise MCPError(
            code=types.INVALID_REQUEST,
            message="this session serves the handshake protocol era (2025-11-25); requests carrying the "
            "2026-07-28 envelope are not accepted on it",
        )
    return await exchange.session.runner.on_request(exchange, method, params)


async def _modern(exchange: Exchange, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """Each 2026-07-28 request brings its own version, client and capabilities: a connection of its own."""
    if method == "initialize":
        requested = (params or {}).get("protocolVersion")
        data = UnsupportedProtocolVersionErrorData(
            supported=list(MODERN_PROTOCOL_VERSIONS), requested=requested if isinstance(requested, str) else ""
        )
        raise MCPError(
            code=types.UNSUPPORTED_PROTOCOL_VERSION,
            message="this session serves the 2026-07-28 protocol; the initialize handshake is not accepted",
            data=data.model_dump(mode="json"),
        )
    route = classify_inbound_request({"method": method, "params": params})
    if isinstance(route, InboundLadderRejection):
        raise MCPError(code=route.code, message=route.message, data=route.data)
    outbound = NotifyOnlyOutbound(exchange.session.standalone)
    connection = Connection.from_envelope(
        route.protocol_version, route.client_info, route.client_capabilities, outbound=outbound
    )
    try:
        return await ServerRunner(server, connection, None).on_request(exchange, method, params)
    finally:
        await _unwind(connection)


async def _unwind(connection: Connection) -> None:
    """End a request's own connection. The SDK's unwind arms a timer and a shielded scope (about 15 us of CPU a
    request) even when nothing was registered to unwind, which on a request's connection is the usual case."""
    if connection.exit_stack._exit_callbacks:  # the stack's own record of what it would run
        await aclose_shielded(connection)


async def _answer(exchange: Exchange, request: types.JSONRPCRequest, out: Push) -> None:
    """Run one request and put its reply last on `out`; a request the agent cancelled gets none."""
    answering.set(exchange.message_metadata.request_context)  # this task's own context: gone with it
    serve = _modern if exchange.session.era == MODERN else _legacy
    reply: types.JSONRPCMessage | None = None
    try:
        with exchange.scope:
            try:
                result = await serve(exchange, request.method, request.params)
            finally:
                exchange.closed = True
                key = coerce_request_id(request.id)
                if exchange.session.running.get(key) is exchange:
                    del exchange.session.running[key]
            reply = types.JSONRPCResponse(jsonrpc="2.0", id=request.id, result=result)
    except Exception as exc:
        error = modern_error_data(exc)  # MCPError as it is, bad params as -32602, anything else logged
        reply = types.JSONRPCError(jsonrpc="2.0", id=request.id, error=error)
    if reply is not None and not exchange.cancel_requested.is_set():
        try:
            await out(reply)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            logger.debug("dropped the reply to %r: its transport stopped listening", request.id)


_log_failure = failure_logger(logger, "MCP request task")


def start(
    request: types.JSONRPCRequest, session: McpSession, caller: Caller, out: Push
) -> tuple[Exchange, asyncio.Task]:
    """Start a request in a task of its own: what its handler sends, and then its reply, go to `out` (which
    must not wait for a reader: a transport's stream, or `handle`'s backlog). Its exchange's scope stops it."""
    if not session.era:
        session.era = MODERN if request.method != "initialize" and _enveloped(request.params) else LEGACY
    exchange = _exchange(session, caller, out, request.id, request.params)
    session.running[coerce_request_id(request.id)] = exchange
    task = asyncio.create_task(_answer(exchange, request, out))
    task.add_done_callback(_log_failure)
    return exchange, task


async def _request(
    request: types.JSONRPCRequest, session: McpSession, caller: Caller
) -> AsyncIterator[types.JSONRPCMessage]:
    out, replies = anyio.create_memory_object_stream[types.JSONRPCMessage](BACKLOG)
    exchange, task = start(request, session, caller, out.send)
    task.add_done_callback(lambda _: out.close())
    try:
        async with replies:
            async for message in replies:
                yield message
    finally:
        if not task.done():  # the transport stopped listening: so does the request
            exchange.scope.cancel()


async def handle(
    message: types.JSONRPCMessage, session: McpSession, caller: Caller
) -> AsyncIterator[types.JSONRPCMessage]:
    """The messages to send back for `message`, in order: for a request, what its handler sends while it runs
    and then its reply; for a notification or an answer to the gateway's question, none."""
    if isinstance(message, types.JSONRPCRequest):
        async for reply in _request(message, session, caller):
            yield reply
    elif isinstance(message, types.JSONRPCNotification):
        if message.method == "notifications/cancelled":
            session.cancel(cancelled_request_id_from_params(message.params))
        exchange = _exchange(session, caller, session.push)
        if session.era == MODERN:
            outbound = NotifyOnlyOutbound(session.standalone)
            connection = Connection.from_envelope(LATEST_MODERN_VERSION, None, None, outbound=outbound)
            try:
                await ServerRunner(server, connection, None).on_notify(exchange, message.method, message.params)
            finally:
                await _unwind(connection)
        else:
            await session.runner.on_notify(exchange, message.method, message.params)
    else:
        session.answered(message)
