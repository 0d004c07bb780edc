"""The minimal pass-through on the gateway's own stack: the demo upstream over stdio re-exposed on /mcp by
the `mcp` 2.x SDK's low-level `Server` and its Streamable HTTP session manager, under Daphne. No
authentication, policy, audit or Django: what the stack the gateway is built on costs by itself, so that
the benchmark can tell the stack's share of a call from the gateway's own. Started by bench/run.py:

    python -m daphne -b 127.0.0.1 -p PORT bench.sdk_passthrough:app
"""

import asyncio
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters, types
from mcp.server import Server

DEMO_UPSTREAM = Path(__file__).resolve().parent.parent / "examples/demo_upstream.py"
DEMO = StdioServerParameters(command=sys.executable, args=[str(DEMO_UPSTREAM)])


@asynccontextmanager
async def lifespan(_server: Server) -> Any:
    async with Client(DEMO) as upstream:
        yield upstream


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return await ctx.lifespan_context.list_tools()


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    return await ctx.lifespan_context.call_tool(params.name, params.arguments or {})


server = Server("sdk-passthrough", lifespan=lifespan, on_list_tools=list_tools, on_call_tool=call_tool)
sdk_app = server.streamable_http_app()
_running: asyncio.Future | None = None
_serving: asyncio.Task | None = None  # held so that the task is not collected


async def _serve(ready: asyncio.Future) -> None:
    async with server.session_manager.run():
        ready.set_result(None)
        await asyncio.Event().wait()


async def app(scope: dict, receive: Any, send: Any) -> None:
    # Daphne runs no ASGI lifespan, so the session manager starts with the first request (as in the gateway).
    global _running, _serving
    if _running is None:
        _running = asyncio.get_running_loop().create_future()
        _serving = asyncio.get_running_loop().create_task(_serve(_running))
    await _running
    await sdk_app(scope, receive, send)
