"""A small MCP server shipped with Switchboard: the demo's second upstream and the tests' workhorse.

Run it over stdio (`python examples/demo_upstream.py`) or Streamable HTTP (`... http PORT`, 127.0.0.1 only).
DEMO_MANIFEST names a JSON file read on every request, to play a server whose tools change:
{"descriptions": {"echo": "..."}, "tools": [extra tool definitions, which answer like echo]}; with it the
server also offers what the file lists under "resources" and "resourceTemplates" (list entries; a resource
reads as "content of <uri>"), "prompts" ({name: {"description", "text", "arguments"}}: prompts/get answers
with the text, then each argument given) and "instructions" (told to each new connection).
DEMO_LEGACY_ONLY=1 plays a server that speaks only 2025-11-25 (no server/discover); DEMO_MODERN_ONLY=1 one that
speaks only 2026-07-28 (no initialize).
DEMO_PUSH=1 plays one whose `ask` asks on the call's stream in either era, as SDK servers that call
`ctx.session.create_message` or `ctx.elicit` do: a 2026-07-28 client gives it no channel for that.
"""

import json
import os
import re
import sys
import tempfile
from pathlib import Path

import anyio
from mcp import types
from mcp.server import NotificationOptions, Server
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

# What `announce` may say changed: the event for 2026-07-28 listeners, the notification for 2025-11-25 sessions.
ANNOUNCED = {
    "tools": (ToolsListChanged, "send_tool_list_changed"),
    "prompts": (PromptsListChanged, "send_prompt_list_changed"),
    "resources": (ResourcesListChanged, "send_resource_list_changed"),
}
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
        description="Wait for the given number of seconds, then answer. With a `mark`, a file of that name "
        "appears in STARTED_DIR as it starts, and in CANCELLED_DIR if the call is cancelled first (to check "
        "that cancellation reaches the server).",
        input_schema={
            "type": "object",
            "properties": {"seconds": {"type": "number"}, "mark": {"type": "string", "pattern": "^[a-z0-9-]{1,64}$"}},
        },
    ),
    types.Tool(
        name="crash",
        description="Exit the server process mid-call (for trying restarts).",
        input_schema={"type": "object", "properties": {}},
    ),
    types.Tool(
        name="pid",
        description="The server's process id, and its PID namespace (a sandboxed server's id is its namespace's).",
        input_schema={"type": "object", "properties": {}},
    ),
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
        name="progress",
        description="Send a progress notification every 0.1 s for the given number of seconds (each with `message`, if "
        "given), then answer.",
        input_schema={"type": "object", "properties": {"seconds": {"type": "number"}, "message": {"type": "string"}}},
    ),
    types.Tool(
        name="ask",
        description="Ask the client something and answer with what it said: the user a question (elicitation), "
        "its model a prompt (sampling), or its roots.",
        input_schema={
            "type": "object",
            "properties": {
                "question": {"type": "string"},
                "of": {"type": "string", "enum": ["elicitation", "sampling", "roots"], "default": "elicitation"},
            },
            "required": ["question"],
        },
    ),
    types.Tool(
        name="needs_sampling",
        description="Refuse with -32021 (missing client capability) unless the client declared sampling.",
        input_schema={"type": "object", "properties": {}},
    ),
    types.Tool(
        name="log",
        description="Send three log messages (debug, info, warning), each ending with `text` if given, then answer.",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
    ),
    types.Tool(
        name="announce",
        description="Tell the client that one of this server's lists changed (tools: after DEMO_MANIFEST was edited).",
        input_schema={"type": "object", "properties": {"list": {"type": "string", "enum": list(ANNOUNCED)}}},
    ),
    types.Tool(
        name="leak",
        description="Fail with a message full of infrastructure details and credentials (for trying redaction).",
        input_schema={
            "type": "object",
            "properties": {"how": {"type": "string", "enum": ["result", "error", "validation", "own-key"]}},
        },
    ),
    types.Tool(
        name="env",
        description="The value of a DEMO_* environment variable (to check what a gateway passes).",
        input_schema={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    ),
    types.Tool(
        name="header",
        description="Over HTTP: the value of the named request header (to check what a gateway sends).",
        input_schema={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    ),
    types.Tool(
        name="query",
        description="Over HTTP: the value of the named query parameter of the request's URL (to check what a "
        "gateway sends).",
        input_schema={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    ),
    types.Tool(
        name="nested",
        description="Answer with structured content holding lists nested `levels` deep (for trying depth limits).",
        input_schema={"type": "object", "properties": {"levels": {"type": "integer", "minimum": 1, "maximum": 250}}},
    ),
    types.Tool(
        name="trace",
        description="The W3C traceparent the request's _meta carried (to check what a gateway propagates).",
        input_schema={"type": "object", "properties": {}},
    ),
]


MISSING_CLIENT_CAPABILITY = -32021


def text(value: str, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=value)], is_error=is_error)


LEAK = (
    "upstream failed: POST https://api.internal.example.com:8443/v1/run?key=abc failed from 10.20.30.40:5432 "
    "and [fd00::17]:80, config /etc/demo/secrets.json, header Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abcdefghij"
    "KLMNOP.qrstuvwxyz0123, api_key=sk-live-0123456789abcdefghij\n"
    'Traceback (most recent call last):\n  File "/srv/demo/app.py", line 12, in run\n    connect()\n'
    "ConnectionError: refused\nCaused by: java.net.ConnectException at db.internal:5432"
)
VALIDATION = "Input validation error: 'path' must be like /srv/data/x.json and 'host' like 10.0.0.1, got 'x'"


def manifest() -> dict:
    path = os.environ.get("DEMO_MANIFEST")
    return json.loads(open(path).read()) if path else {}


async def list_tools(ctx, params) -> types.ListToolsResult:
    changes = manifest()
    descriptions = changes.get("descriptions", {})
    tools = [tool.model_copy(update={"description": descriptions.get(tool.name, tool.description)}) for tool in TOOLS]
    return types.ListToolsResult(tools=tools + [types.Tool.model_validate(t) for t in changes.get("tools", [])])


async def progress(
    ctx, params: types.CallToolRequestParams, seconds: float, message: str | None
) -> types.CallToolResult:
    """Progress with the caller's token, or a made-up one: a server that tries to keep a call alive."""
    token = (params.meta or {}).get("progress_token") or "demo-progress"
    for step in range(int(seconds * 10)):
        await ctx.session.send_progress_notification(token, step, message=message, related_request_id=ctx.request_id)
        await anyio.sleep(0.1)
    return text("done")


CANCELLED_DIR = Path(tempfile.gettempdir()) / "switchboard-demo-cancelled"
STARTED_DIR = Path(tempfile.gettempdir()) / "switchboard-demo-started"


def _touch(folder: Path, mark: str) -> None:
    if re.fullmatch(r"[a-z0-9-]{1,64}", mark):
        folder.mkdir(exist_ok=True)
        (folder / mark).touch()


async def sleep(seconds: float, mark: str) -> types.CallToolResult:
    _touch(STARTED_DIR, mark)
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        _touch(CANCELLED_DIR, mark)
        raise
    return text("slept")


def _question(of: str, question: str) -> tuple[types.ServerRequest, type]:
    """What `ask` sends the client, and the type of its answer."""
    if of == "sampling":
        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=question))
        request = types.CreateMessageRequest(params=types.CreateMessageRequestParams(messages=[message], max_tokens=50))
        return request, types.CreateMessageResult
    if of == "roots":
        return types.ListRootsRequest(), types.ListRootsResult
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    request = types.ElicitRequest(params=types.ElicitRequestFormParams(message=question, requested_schema=schema))
    return request, types.ElicitResult


def _said(result: types.Result) -> str:
    if isinstance(result, types.ElicitResult):
        return f"{result.action}: {json.dumps(result.content, sort_keys=True)}"
    if isinstance(result, types.CreateMessageResult):
        return f"the model said: {result.content.text}"
    return "roots: " + ", ".join(str(root.uri) for root in result.roots)


async def ask(ctx, params: types.CallToolRequestParams, of: str, question: str) -> types.CallToolResult:
    """A question in the caller's era: a request on the call's stream (2025-11-25), or an input-required
    result answered by the retry (2026-07-28); on the call's stream in either era with DEMO_PUSH."""
    request, answer_type = _question(of, question)
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and not os.environ.get("DEMO_PUSH"):
        answer = (params.input_responses or {}).get("answer")
        if answer is None:
            return types.InputRequiredResult(input_requests={"answer": request})
        result = answer_type.model_validate(answer.model_dump(by_alias=True, exclude_none=True))
    else:
        related = ServerMessageMetadata(related_request_id=ctx.request_id)
        result = await ctx.session.send_request(request, answer_type, metadata=related)
    return text(_said(result))


def leak(how: str) -> types.CallToolResult:
    if how == "own-key":  # as APIs do: "invalid key <the key you sent>"
        raise MCPError(types.INVALID_PARAMS, f"invalid key {os.environ.get('DEMO_SECRET', '')}: try another")
    if how == "error":
        raise MCPError(types.INTERNAL_ERROR, LEAK)
    if how == "validation":
        raise MCPError(types.INVALID_PARAMS, VALIDATION)
    return text(LEAK, is_error=True)


def nested(levels: int) -> types.CallToolResult:
    """Built without recursion; the SDK serialises up to about 250 levels."""
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return types.CallToolResult(content=[], structured_content={"value": value})


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
            return await sleep(float(args.get("seconds", 1)), str(args.get("mark", "")))
        case "crash":
            os._exit(3)
        case "pid":
            return text(f"{os.getpid()} {os.readlink('/proc/self/ns/pid')}")
        case "raise":
            raise RuntimeError("the demo server failed on purpose")
        case "bad_output":
            return types.CallToolResult(
                content=[types.TextContent(type="text", text="n?")], structured_content={"n": "not a number"}
            )
        case "progress":
            return await progress(ctx, params, float(args.get("seconds", 1)), args.get("message"))
        case "ask":
            return await ask(ctx, params, str(args.get("of", "elicitation")), str(args.get("question", "")))
        case "needs_sampling":
            capabilities = ctx.session.client_capabilities
            if capabilities is None or capabilities.sampling is None:
                needs = {"requiredCapabilities": {"sampling": {}}}
                raise MCPError(MISSING_CLIENT_CAPABILITY, "This tool needs the sampling capability.", needs)
            return text("sampling declared")
        case "log":
            said = f": {args['text']}" if args.get("text") else ""
            for level in ("debug", "info", "warning"):
                await ctx.session.send_log_message(
                    level, f"a {level} message{said}", "demo", related_request_id=ctx.request_id
                )
            return text("logged")
        case "announce":
            event, notify = ANNOUNCED[str(args.get("list", "tools"))]
            if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                await changes.publish(event())
            else:
                await getattr(ctx.session, notify)()
            return text("announced")
        case "leak":
            return leak(str(args.get("how", "result")))
        case "env":
            name = str(args["name"])
            return text(os.environ.get(name, "") if name.startswith("DEMO_") else "")
        case "nested":
            return nested(min(int(args.get("levels", 1)), 250))
        case "trace":
            return text(str((params.meta or {}).get("traceparent", "")))
        case "header":
            headers = ctx.request.headers if ctx.request is not None else {}
            return text(headers.get(str(args["name"]), ""))
        case "query":
            query = ctx.request.query_params if ctx.request is not None else {}
            return text(query.get(str(args["name"]), ""))
    if any(tool.get("name") == params.name for tool in manifest().get("tools", [])):
        return text(str(args.get("text", "")))
    raise ValueError(f"Unknown tool: {params.name}")


async def list_resources(ctx, params) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=manifest().get("resources", []))


async def list_resource_templates(ctx, params) -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(resource_templates=manifest().get("resourceTemplates", []))


async def read_resource(ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    said = types.TextResourceContents(uri=params.uri, mime_type="text/plain", text=f"content of {params.uri}")
    return types.ReadResourceResult(contents=[said])


async def list_prompts(ctx, params) -> types.ListPromptsResult:
    prompts = manifest().get("prompts", {})
    return types.ListPromptsResult(
        prompts=[
            types.Prompt(name=name, description=p.get("description"), arguments=p.get("arguments"))
            for name, p in prompts.items()
        ]
    )


async def get_prompt(ctx, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    prompt = manifest().get("prompts", {}).get(params.name)
    if prompt is None:
        raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {params.name}")
    said = " ".join([prompt.get("text", ""), *(params.arguments or {}).values()])
    message = types.PromptMessage(role="user", content=types.TextContent(type="text", text=said))
    return types.GetPromptResult(description=prompt.get("description"), messages=[message])


class DemoServer(Server):
    """Its instructions are the manifest's, when it gives some: read as each connection opens."""

    @property
    def instructions(self) -> str | None:
        return manifest().get("instructions", self._instructions)

    @instructions.setter
    def instructions(self, value: str | None) -> None:
        self._instructions = value


changes = InMemorySubscriptionBus()  # 2026-07-28 clients hear of changes on subscriptions/listen streams
offering = bool(os.environ.get("DEMO_MANIFEST"))  # resources and prompts only when a manifest may list them
server = DemoServer(
    "switchboard-demo",
    version="1.0",
    instructions="Tools for trying a gateway out: echo and add answer at once; sleep, progress and ask take time.",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_resources=list_resources if offering else None,
    on_list_resource_templates=list_resource_templates if offering else None,
    on_read_resource=read_resource if offering else None,
    on_list_prompts=list_prompts if offering else None,
    on_get_prompt=get_prompt if offering else None,
    on_subscriptions_listen=ListenHandler(changes),
)


async def modern_only(ctx, call_next):
    """DEMO_MODERN_ONLY's handshake: none, as a server of 2026-07-28 alone."""
    if ctx.method == "initialize":
        raise MCPError(types.METHOD_NOT_FOUND, "Method not found", "initialize")
    return await call_next(ctx)


if os.environ.get("DEMO_MODERN_ONLY"):
    server.middleware.append(modern_only)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        import uvicorn

        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
    else:
        from mcp.server.runner import serve_loop
        from mcp.server.stdio import stdio_server

        async def serve() -> None:
            async with stdio_server() as (read, write):
                options = server.create_initialization_options(NotificationOptions(tools_changed=True))
                if os.environ.get("DEMO_LEGACY_ONLY"):  # the handshake era only: clients fall back to initialize
                    async with server.lifespan(server) as state:
                        await serve_loop(server, read, write, lifespan_state=state, init_options=options)
                else:
                    await server.run(read, write, options)

        try:
            anyio.run(serve)
        except* BrokenPipeError:  # the client went away: nothing left to say
            pass


if __name__ == "__main__":
    main()
