"""The soak's load (bench/soak.py): clients of every kind a gateway serves, each cycling the same operations at
its share of a rate and starting over with a new session (or socket) every `session_ops` operations.

- legacy: the SDK client in a 2025-11-25 session over Streamable HTTP (ended with a DELETE as it closes);
- stateless: the SDK client in the 2026-07-28 era (no session: each request stands alone);
- ws: JSON-RPC on /mcp/ws, a 2025-11-25 handshake on each new socket.
"""

import asyncio
import itertools
import json
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx2
import websockets
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

KINDS = ["legacy", "stateless", "ws"]
DOMAIN = "finance"
TRIAGE = f"switchboard__handoff_to_{DOMAIN}"
RETURN = "switchboard__return_to_triage"
CODE = """const sum = await tools.demo.add({ a: 40, b: 2 });
const echoed = await tools.demo.echo({ text: "soak" });
return { sum, echoed };"""
# One client's operations, in this order, over and over: 25 of which 16 plain calls (an echo of a random text,
# a 50 ms sleep, the time), 6 tools/list, two code-mode executions (a search, then an execution that makes two
# calls) and one handoff round trip (three calls).
MIX = ["echo", "list", "sleep", "time", "execute", "echo", "list", "sleep", "echo", "time", "handoff", "echo"]
MIX += ["list", "sleep", "echo", "time", "execute", "echo", "list", "sleep", "echo", "list", "time", "echo", "list"]
TIMEOUT = 30.0
HANDSHAKE = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "soak", "version": "1"}}


class Refused(Exception):
    """An operation's answer was not the one expected."""


class Session(Protocol):
    async def call(self, name: str, arguments: dict[str, Any]) -> str: ...
    async def names(self) -> set[str]: ...


@dataclass
class Tally:
    done: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    def fail(self, kind: str, error: BaseException) -> None:
        self.failed[kind] += 1
        while isinstance(error, BaseExceptionGroup) and error.exceptions:  # the SDK's task groups wrap the cause
            error = error.exceptions[0]
        if len(self.errors) < 20:
            self.errors.append(f"{kind}: {type(error).__name__}: {error}"[:500])


class SdkSession:
    def __init__(self, client: Client) -> None:
        self.client = client

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        result = await self.client.call_tool(name, arguments)
        if result.is_error:
            raise Refused(f"error result: {result.content}")
        return "".join(getattr(part, "text", "") for part in result.content)

    async def names(self) -> set[str]:
        return {tool.name for tool in (await self.client.list_tools(cache_mode="bypass")).tools}


class WsSession:
    """JSON-RPC over /mcp/ws: one request at a time, a notification sent meanwhile skipped."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = next(self._ids)
        await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}))
        async with asyncio.timeout(TIMEOUT):
            while (frame := json.loads(await self.ws.recv())).get("id") != request_id:
                pass
        if "result" not in frame:
            raise Refused(f"{method}: {frame}")
        return frame["result"]

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        result = await self.request("tools/call", {"name": name, "arguments": arguments})
        if result.get("isError"):
            raise Refused(f"error result: {result['content']}")
        return "".join(part.get("text", "") for part in result["content"])

    async def names(self) -> set[str]:
        return {tool["name"] for tool in (await self.request("tools/list", {}))["tools"]}


@asynccontextmanager
async def session_open(url: str, key: str, kind: str) -> AsyncIterator[Session]:
    if kind == "ws":
        socket_url = url.replace("http://", "ws://") + "/mcp/ws"
        headers = {"Authorization": f"Bearer {key}"}
        async with websockets.connect(socket_url, additional_headers=headers, open_timeout=TIMEOUT) as ws:
            session = WsSession(ws)
            await session.request("initialize", HANDSHAKE)
            await ws.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            yield session
        return
    mode = "legacy" if kind == "legacy" else "2026-07-28"
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=TIMEOUT) as http:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode) as client:
            yield SdkSession(client)


def expect(text: str, part: str) -> None:
    if part not in text:
        raise Refused(f"expected {part!r} in {text[:300]!r}")


async def op_echo(session: Session, n: int) -> None:
    text = secrets.token_urlsafe(12 + n % 40)  # a new text each time: nothing the gateway could keep by value
    expect(await session.call("demo__echo", {"text": text}), text)


async def op_sleep(session: Session, n: int) -> None:
    expect(await session.call("demo__sleep", {"seconds": 0.05, "mark": ""}), "slept")


async def op_time(session: Session, n: int) -> None:
    expect(await session.call("time__get_current_time", {"timezone": "UTC"}), '"timezone": "UTC"')


async def op_list(session: Session, n: int) -> None:
    names = await session.names()
    if not {"demo__echo", "time__get_current_time", TRIAGE, "switchboard__execute"} <= names:
        raise Refused(f"tools/list lacks a tool: {sorted(names)}")


async def op_handoff(session: Session, n: int) -> None:
    expect(await session.call(TRIAGE, {"reason": "a soak question", "context": {"n": n}}), "Handed off to the finance")
    expect(await session.call(f"{DOMAIN}__ask", {"question": f"q{n}"}), f"'q{n}'")
    expect(await session.call(RETURN, {"note": f"n{n}"}), f"summary: n{n}")


async def op_execute(session: Session, n: int) -> None:
    expect(await session.call("switchboard__search_tools", {"query": "add two numbers", "k": 3}), "tools.demo.add")
    expect(await session.call("switchboard__execute", {"code": CODE}), '"sum": 42')


OPERATIONS: dict[str, Callable[[Session, int], Awaitable[None]]] = {
    "echo": op_echo,
    "sleep": op_sleep,
    "time": op_time,
    "list": op_list,
    "handoff": op_handoff,
    "execute": op_execute,
}


@dataclass
class Pace:
    interval: float  # seconds between one client's operations
    deadline: float  # time.monotonic() at which the client stops
    session_ops: int  # operations before it opens a new session


async def client_drive(url: str, key: str, kind: str, pace: Pace, tally: Tally, offset: int) -> None:
    """MIX from `offset`, one operation every `pace.interval` seconds (late ones are not made up in a burst)."""
    mix = itertools.islice(itertools.cycle(MIX), offset, None)
    counter = itertools.count()
    next_at = time.monotonic()
    while time.monotonic() < pace.deadline:
        step = "connect"
        try:
            async with session_open(url, key, kind) as session:
                for _ in range(pace.session_ops):
                    next_at = max(next_at + pace.interval, time.monotonic() - pace.interval)
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                    if time.monotonic() >= pace.deadline:
                        return
                    step = next(mix)
                    await OPERATIONS[step](session, next(counter))
                    tally.done[step] += 1
                step = "disconnect"
            tally.done[f"{kind} sessions"] += 1
        except Exception as error:  # every failure is counted and reported; the client opens a new session
            tally.fail(f"{kind} {step}", error)


async def ready_wait(url: str, key: str) -> None:
    """Until the gateway lists the triage tool (its snapshot has the route), within a bound."""
    deadline = time.monotonic() + 30
    while True:
        async with session_open(url, key, "legacy") as session:
            names = await session.names()
        if TRIAGE in names or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.2)
