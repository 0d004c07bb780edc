"""What an upstream sends back while it works on a call, on its way to the agent that made the call:
progress, log messages, and requests to the client (elicitation, sampling, roots), whose answers go
the other way.

The gateway hands the executor a `Relay` for each call; one that `wanted` nothing (no progress token,
no capability, no log level) is not carried at all. The inline executor runs the call on the pool
thread's loop, so `LoopRelay` carries each event over to the web loop. The Celery executor runs it in a
worker process: `ChannelRelay` (worker side) sends events over the channel layer to `relay_pump` (web
side), which answers requests on a channel of the call's own. Cancellation needs no relay: a web process
names the call to every worker process's `cancel_listener`, and the one running it cancels it.
"""

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import anyio
from channels.layers import get_channel_layer
from mcp import types
from mcp.shared.exceptions import MCPError

from gateway_project.lib.channel_groups import membership_kept

T = TypeVar("T")
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ask:
    """A request an upstream may make of the client: the capability it needs, its wire types, and the
    keyword of the SDK client's callback that answers it."""

    capability: str
    request: type
    result: type
    callback: str


ASKS = {
    "elicitation/create": Ask("elicitation", types.ElicitRequest, types.ElicitResult, "elicitation_callback"),
    "sampling/createMessage": Ask(
        "sampling", types.CreateMessageRequest, types.CreateMessageResult, "sampling_callback"
    ),
    "roots/list": Ask("roots", types.ListRootsRequest, types.ListRootsResult, "list_roots_callback"),
}
# The client capabilities an upstream may use through the gateway, when the agent declared them.
RELAYED_CAPABILITIES = tuple(ask.capability for ask in ASKS.values())
# Not a client capability, but routed like one: the agent asked for log messages (a level set for its
# 2025-11-25 session, or a 2026-07-28 request's logLevel), so its calls go where logs can be told apart.
LOGGING = "logging"
# Nor is this: the agent speaks 2025-11-25 and declared something an upstream may ask, so its connection speaks
# that era too wherever the upstream does, and an upstream may ask on the call's stream (registry/upstreams/pool.py).
LEGACY = "legacy"
# The connection of a 2025-11-25 agent's calls that carry nothing back (pool.py): that era, unserialised.
PLAIN_LEGACY = frozenset({LEGACY})


class Relay(Protocol):
    capabilities: frozenset[str]  # of RELAYED_CAPABILITIES, those the agent declared (and LOGGING, LEGACY)
    wanted: bool  # whether anything need travel back at all

    async def progress(self, progress: float, total: float | None, message: str | None) -> None: ...

    async def log(self, level: str, data: Any, logger: str | None) -> None: ...

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The agent's answer to a request of the upstream (ASKS), or MCPError."""
        ...


def carried(relay: Relay | None) -> Relay | None:
    """The relay, if the agent wants anything back; else None, and a plain call carries nothing."""
    return relay if relay is not None and relay.wanted else None


class LoopRelay:
    """A relay living on another event loop (the web's), used from the pool thread's loop."""

    wanted = True

    def __init__(self, relay: Relay, loop: asyncio.AbstractEventLoop) -> None:
        self.capabilities = relay.capabilities
        self._relay, self._loop = relay, loop

    async def _over(self, coro: Awaitable[T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))  # type: ignore[arg-type]

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        await self._over(self._relay.progress(progress, total, message))

    async def log(self, level: str, data: Any, logger: str | None) -> None:
        await self._over(self._relay.log(level, data, logger))

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return await self._over(self._relay.ask(method, params))


def relay_channels(call: str) -> dict[str, str]:
    """The channels of one relayed call. Plain names (no `!`), so that any process may receive on them."""
    return {"events": f"upstream-call.{call}.events"}


class ChannelRelay:
    """Worker side: the relay of a call whose agent waits in a web process (`relay_pump`)."""

    wanted = True

    def __init__(self, channels: dict[str, str], capabilities: list[str]) -> None:
        self.capabilities = frozenset(capabilities) & frozenset((*RELAYED_CAPABILITIES, LOGGING, LEGACY))
        self._events = channels["events"]
        self._layer = get_channel_layer()
        self._sent = 0

    async def _send(self, event: dict[str, Any]) -> None:
        # Numbered (before the await: callbacks may run concurrently): the channel layer may deliver messages
        # sent within the same instant out of order.
        number, self._sent = self._sent, self._sent + 1
        await self._layer.send(self._events, event | {"n": number})

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        await self._send({"type": "progress", "args": [progress, total, message]})

    async def log(self, level: str, data: Any, logger: str | None) -> None:
        await self._send({"type": "log", "args": [level, data, logger]})

    async def end(self) -> None:
        """The call is over: the web side has every event once it reads this (then the reply)."""
        await self._send({"type": "end"})

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        answers = f"{self._events}.{uuid.uuid4().hex}"
        await self._send({"type": "ask", "method": method, "params": params, "reply": answers})
        answer = await self._layer.receive(answers)
        if "error" in answer:
            raise MCPError(answer["error"]["code"], answer["error"]["message"])
        return answer["result"]


async def relay_pump(channels: dict[str, str], relay: Relay) -> None:
    """Web side: hand each event of a call running in a worker to the agent's relay, until the call's end."""
    layer, early, following = get_channel_layer(), {}, 0
    async with anyio.create_task_group() as tg:
        while True:
            received = await layer.receive(channels["events"])
            early[received["n"]] = received
            while following in early:  # in the order they were sent
                event = early.pop(following)
                following += 1
                if event["type"] == "end":
                    return
                if event["type"] == "progress":
                    await relay.progress(*event["args"])
                elif event["type"] == "log":
                    await relay.log(*event["args"])
                elif event["type"] == "ask":
                    tg.start_soon(_answer, layer, relay, event)


async def _answer(layer: Any, relay: Relay, event: dict[str, Any]) -> None:
    try:
        answer: dict[str, Any] = {"result": await relay.ask(event["method"], event["params"])}
    except MCPError as refused:
        answer = {"error": {"code": refused.error.code, "message": refused.error.message}}
    await layer.send(event["reply"], answer)


CANCELS = "upstream-call-cancels"  # the group every worker process listens on for cancellations
_running: dict[str, anyio.CancelScope] = {}  # worker side: the calls this process runs, by call id


async def cancel_remote(call: str) -> None:
    """Web side: the agent left, so the worker running the call stops it (and the upstream hears of it)."""
    await get_channel_layer().group_send(CANCELS, {"type": "cancel", "call": call})


async def cancellable(work: Callable[[], Awaitable[T]], call: str, cancelled: T) -> T:
    """Worker side: `work`'s result, or `cancelled` if a web process cancels the call meanwhile."""
    with anyio.CancelScope() as scope:
        _running[call] = scope
        try:
            return await work()
        finally:
            _running.pop(call, None)
    return cancelled


async def cancel_listener() -> None:
    """Worker side, on the pool's loop for the life of the process: one ear for every call's cancellation."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    async with anyio.create_task_group() as kept:
        kept.start_soon(membership_kept, layer, CANCELS, channel)
        while True:
            try:
                message = await layer.receive(channel)
            except Exception:  # Redis went away for a while: calls run to their end until it is back
                logger.warning("cancellation listener: channel layer unavailable", exc_info=True)
                await anyio.sleep(1)
                continue
            if scope := _running.get(message.get("call", "")):
                scope.cancel()


def may_ask(method: Any, capabilities: frozenset[str]) -> bool:
    """Whether an upstream may put this request to an agent that declared `capabilities`."""
    ask = ASKS.get(method)
    return ask is not None and ask.capability in capabilities


def unsupported(method: str) -> MCPError:
    return MCPError(types.METHOD_NOT_FOUND, f"The client did not declare the capability for {method}.")
