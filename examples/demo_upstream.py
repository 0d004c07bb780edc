"""A small MCP server shipped with Switchboard: the demo's second upstream and the tests' workhorse.

Run it over stdio (`python examples/demo_upstream.py`) or Streamable HTTP (`... http PORT`, 127.0.0.1 only).
"""

import os
import sys

import anyio
from mcp import types
from mcp.server import Server

TOOLS = [
    types.Tool(
        name="echo",
        description="Return the text you send.",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    ),
    types.Tool(
        name="add",
        description="Add two numbers.",
        input_schema={
            "type": "object",
            "required": ["a", "b"],
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        },
    ),
    types.Tool(
        name="fail",
        description="Always report a tool error (for trying error handling).",
        input_schema={"type": "object", "properties": {}},
    ),
    types.Tool(
        name="sleep",
        description="Wait for the given number of seconds, then answer.",
        input_schema={"type": "object", "properties": {"seconds": {"type": "number"}}},
    ),
    types.Tool(
        name="crash",
        description="Exit the server process mid-call (for trying restarts).",
        input_schema={"type": "object", "properties": {}},
    ),
    types.Tool(name="pid", description="The server's process id.", input_schema={"type": "object", "properties": {}}),
    types.Tool(
        name="raise",
        description="Raise an exception inside the server (a JSON-RPC error results).",
        input_schema={"type": "object", "properties": {}},
    ),
    types.Tool(
        name="bad_output",
        description="Answer with structured content that breaks its own output schema.",
        input_schema={"type": "object", "properties": {}},
        output_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    ),
    types.Tool(
        name="header",
        description="Over HTTP: the value of the named request header (to check what a gateway sends).",
        input_schema={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    ),
]


def text(value: str, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=value)], is_error=is_error)


async def list_tools(ctx, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    match params.name:
        case "echo":
            return text(str(args.get("text", "")))
        case "add":
            return text(str(args["a"] + args["b"]))
        case "fail":
            return text("this tool always fails", is_error=True)
        case "sleep":
            await anyio.sleep(float(args.get("seconds", 1)))
            return text("slept")
        case "crash":
            os._exit(3)
        case "pid":
            return text(str(os.getpid()))
        case "raise":
            raise RuntimeError("the demo server failed on purpose")
        case "bad_output":
            return types.CallToolResult(
                content=[types.TextContent(type="text", text="n?")], structured_content={"n": "not a number"}
            )
        case "header":
            headers = ctx.request.headers if ctx.request is not None else {}
            return text(headers.get(str(args["name"]), ""))
    raise ValueError(f"Unknown tool: {params.name}")


server = Server("switchboard-demo", version="1.0", on_list_tools=list_tools, on_call_tool=call_tool)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        import uvicorn

        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
    else:
        from mcp.server.stdio import stdio_server

        async def serve() -> None:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(serve)


if __name__ == "__main__":
    main()
