"""MCP clients for the tests: the official SDK client, and raw HTTP/WebSocket for the error paths."""

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import httpx2
import websockets
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

TIMEOUT = 5.0
# An SDK client's wait for each answer: longer than TIMEOUT, since a call's answer waits on the upstream, PostgreSQL
# and the worker on a shared two-core machine (test_relay's input-required rounds took over 5 s under load).
ANSWER_TIMEOUT = 20.0
ACCEPT = "application/json, text/event-stream"  # what a POST must accept, in both eras
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "switchboard-tests", "version": "1"},
    },
}


@asynccontextmanager
async def sdk_client(
    base_url: str, key: str | None, mode: str, timeout: float = ANSWER_TIMEOUT, path: str = "/mcp", **options: Any
) -> AsyncIterator[Client]:
    """An SDK client of the gateway's /mcp (or a virtual server's `path`); without a key it sends no credentials."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        client = Client(streamable_http_client(f"{base_url}{path}", http_client=http), mode=mode, **options)
        async with client:
            yield client


class ToolChanges:
    """`notifications/tools/list_changed` as a client receives them: on the session's stream (2025-11-25)
    or on a `subscriptions/listen` stream (2026-07-28)."""

    def __init__(self) -> None:
        self._send, self._received = anyio.create_memory_object_stream[str](100)

    async def on_message(self, message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            self._send.send_nowait(message.method)

    async def listen(self, client: Client, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with client.listen(tools_list_changed=True) as subscription:
            task_status.started()
            async for _event in subscription:
                self._send.send_nowait("notifications/tools/list_changed")

    async def next(self, timeout: float = TIMEOUT) -> str:
        with anyio.fail_after(timeout):
            return await self._received.receive()


class ListChanges:
    """Every list_changed a client is told, in order (`tools`, `prompts`, `resources`), in either era."""

    METHODS = {f"notifications/{kind}/list_changed": kind for kind in ("tools", "prompts", "resources")}
    EVENTS = {"ToolsListChanged": "tools", "PromptsListChanged": "prompts", "ResourcesListChanged": "resources"}

    def __init__(self) -> None:
        self.told: list[str] = []
        self._heard = anyio.Event()

    def _record(self, kind: str) -> None:
        self.told.append(kind)
        self._heard.set()
        self._heard = anyio.Event()

    async def on_message(self, message: Any) -> None:
        if (kind := self.METHODS.get(getattr(message, "method", ""))) is not None:
            self._record(kind)

    async def listen(self, client: Client, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        kinds = {f"{kind}_list_changed": True for kind in ("tools", "prompts", "resources")}
        async with client.listen(**kinds) as subscription:
            task_status.started()
            async for event in subscription:
                self._record(self.EVENTS[type(event).__name__])

    async def until(self, kind: str, timeout: float = TIMEOUT) -> list[str]:
        """Everything told up to and including the first `kind`, once it comes."""
        with anyio.fail_after(timeout):
            while kind not in self.told:
                await self._heard.wait()
        return self.told[: self.told.index(kind) + 1]


@asynccontextmanager
async def _recording(base_url: str, key: str, mode: str, changes: Any, timeout: float) -> AsyncIterator[Client]:
    """A client whose list changes `changes` records: from the session's stream (2025-11-25) or a listen stream."""
    if mode == "legacy":
        async with sdk_client(base_url, key, mode, timeout, message_handler=changes.on_message) as client:
            yield client
        return
    # The listen stream's notifications reach a message_handler too: one source only, or each counts twice.
    async with sdk_client(base_url, key, mode, timeout) as client:
        async with anyio.create_task_group() as tg:
            await tg.start(changes.listen, client)
            yield client
            tg.cancel_scope.cancel()


@asynccontextmanager
async def listening_client(
    base_url: str, key: str, mode: str, timeout: float = TIMEOUT
) -> AsyncIterator[tuple[Client, ListChanges]]:
    """A client that records every list_changed it is told (tools, prompts, resources), in either era."""
    changes = ListChanges()
    async with _recording(base_url, key, mode, changes, timeout) as client:
        yield client, changes


@asynccontextmanager
async def watched_client(
    base_url: str, key: str, mode: str, timeout: float = TIMEOUT
) -> AsyncIterator[tuple[Client, ToolChanges]]:
    """A client that records every tools/list_changed it is told, in either era."""
    changes = ToolChanges()
    async with _recording(base_url, key, mode, changes, timeout) as client:
        yield client, changes


class WebSocketSession:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self._next_id = 0

    async def request(self, method: str, params: dict | None = None) -> dict:
        self._next_id += 1
        await self.ws.send(
            json.dumps({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params or {}})
        )
        return await self._reply()

    async def send_raw(self, frame: str) -> dict:
        await self.ws.send(frame)
        return await self._reply()

    async def _reply(self) -> dict:
        """The next frame with an id: a notification sent meanwhile (a tool list that changed) is not a reply."""
        while "id" not in (frame := await self.receive()):
            pass
        return frame

    async def receive(self) -> dict:
        with anyio.fail_after(TIMEOUT):
            return json.loads(await self.ws.recv())


@asynccontextmanager
async def ws_session(
    base_url: str, key: str, initialize: bool = True, capabilities: dict | None = None, path: str = "/mcp"
) -> AsyncIterator[WebSocketSession]:
    """A JSON-RPC session on /mcp/ws (or `<path>/ws`), initialized (2025-11-25) with the client `capabilities`."""
    url = base_url.replace("http://", "ws://") + f"{path}/ws"
    async with websockets.connect(
        url, additional_headers={"Authorization": f"Bearer {key}"}, open_timeout=TIMEOUT
    ) as ws:
        session = WebSocketSession(ws)
        if initialize:
            declared = {"params": INITIALIZE["params"] | {"capabilities": capabilities or {}}}
            await ws.send(json.dumps(INITIALIZE | declared))
            reply = await session.receive()
            assert reply["result"]["protocolVersion"] == "2025-11-25", reply
            await ws.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        yield session


async def refused_socket(base_url: str, key: str) -> tuple[dict, int | None]:
    """What a /mcp/ws handshake accepted only to say why it is not served gets: that frame, and the close code."""
    url = base_url.replace("http://", "ws://") + "/mcp/ws"
    headers = {"Authorization": f"Bearer {key}"}
    async with websockets.connect(url, additional_headers=headers, open_timeout=TIMEOUT) as ws:
        with anyio.fail_after(TIMEOUT):
            frame = json.loads(await ws.recv())
            await ws.wait_closed()
        return frame, ws.close_code


async def slow_post(base_url: str, key: str, body: bytes = b"") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A POST whose headers promise 64 bytes of body, of which `body` is sent: the rest is the caller's to trickle
    (or not)."""
    host, port = base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\nAccept: {ACCEPT}\r\n"
        "Content-Type: application/json\r\nContent-Length: 64\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    return reader, writer


async def call(base_url: str, key: str, name: str, arguments: dict | None = None, mode: str = "legacy") -> Any:
    """The result of one call in a session of its own, or the MCPError it was refused with."""
    async with sdk_client(base_url, key, mode) as client:
        try:
            return await client.call_tool(name, arguments or {})
        except MCPError as refused:
            return refused


async def tool_names(base_url: str, key: str, mode: str = "legacy", path: str = "/mcp") -> set[str]:
    """The names an agent is offered (at /mcp, or a virtual server's `path`); empty while a gateway does not know
    its key yet."""
    try:
        async with sdk_client(base_url, key, mode, path=path) as client:
            return {tool.name for tool in (await client.list_tools()).tools}
    except Exception:  # 401 until the gateway's snapshot holds the new key: the caller polls
        return set()


def api(gateway, method: str, path: str, token: str | None, **kwargs) -> httpx2.Response:
    """A request to the REST API with an admin token (none: anonymous)."""
    headers = kwargs.pop("headers", {}) | ({"Authorization": f"Bearer {token}"} if token else {})
    return httpx2.request(method, f"{gateway.url}/api/v1/{path}", headers=headers, timeout=TIMEOUT, **kwargs)


def circuit(gateway, slug: str, token: str) -> dict:
    """The upstream's circuit as the gateway itself sees it (in the embedded default, only it knows)."""
    return api(gateway, "GET", f"upstreams/{slug}", token).json()["circuit"]


STATELESS_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def stateless_body(name: str, arguments: dict) -> bytes:
    """A 2026-07-28 tools/call: one request, no session."""
    params = {"name": name, "arguments": arguments, "_meta": STATELESS_META}
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).encode()


def stateless_headers(key: str, name: str) -> dict[str, str]:
    """The headers such a request carries: the era's, and the method and tool named for routing."""
    return {
        "authorization": f"Bearer {key}",
        "accept": ACCEPT,
        "content-type": "application/json",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": name,
    }


async def stateless_call(base_url: str, key: str, name: str, arguments: dict) -> dict:
    """One 2026-07-28 tools/call as a single HTTP request, without the SDK client (which may send more
    requests of its own around it); its JSON-RPC answer."""
    body, headers = stateless_body(name, arguments), stateless_headers(key, name)
    async with httpx2.AsyncClient(timeout=TIMEOUT) as http:
        return reply_of(await http.post(f"{base_url}/mcp", content=body, headers=headers))


def raw_session(url: str, key: str, capabilities: dict | None = None) -> dict[str, str]:
    """A 2025-11-25 session opened with raw HTTP on `url`: the headers each of its requests carries."""
    headers = {"accept": ACCEPT, "authorization": f"Bearer {key}"}
    body = INITIALIZE | {"params": INITIALIZE["params"] | {"capabilities": capabilities or {}}}
    answer = httpx2.post(f"{url}/mcp", json=body, headers=headers, timeout=30)
    version = INITIALIZE["params"]["protocolVersion"]
    return headers | {"mcp-session-id": answer.headers["mcp-session-id"], "mcp-protocol-version": version}


def reply_of(response: httpx2.Response) -> dict:
    """A POST's JSON-RPC answer, sent as JSON or as a stream (whose last event carries it)."""
    if response.headers["content-type"].startswith("text/event-stream"):
        return json.loads([line for line in response.text.splitlines() if line.startswith("data:")][-1][5:])
    return response.json()


class TokenMemory:
    """The SDK client's OAuth token storage, in memory: what it registered and the tokens it got."""

    def __init__(self) -> None:
        self.tokens: Any = None
        self.client: Any = None

    async def get_tokens(self) -> Any:
        return self.tokens

    async def set_tokens(self, tokens: Any) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> Any:
        return self.client

    async def set_client_info(self, client_info: Any) -> None:
        self.client = client_info


def sse_events(response: httpx2.Response) -> Iterator[dict]:
    """The events of an SSE body: each a dict of its fields (data parsed when it is JSON)."""
    event: dict = {}
    for line in response.iter_lines():
        if not line:
            if event:
                yield event
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            event[name] = value.removeprefix(" ")
            if name == "data" and event[name]:
                event[name] = json.loads(event[name])
