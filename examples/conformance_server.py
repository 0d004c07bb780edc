"""An MCP server with the fixtures the official conformance suite (@modelcontextprotocol/conformance)
expects of a server under test: its tools, resources, prompts and input-required flows, in both eras.

Switchboard's conformance run (scripts/conformance) fronts it with the gateway to check that everything
an upstream offers reaches the agent unchanged. Run: `python examples/conformance_server.py PORT [--push]`
(Streamable HTTP at http://127.0.0.1:PORT/mcp). With --push (the run's `conformance-push`), the fixtures of
the sampling and elicitation scenarios ask on the call's stream whatever the era, as SDK servers that call
`ctx.session.create_message` or `ctx.elicit` do: a client that reaches it at 2026-07-28 gives them no channel.
"""

import base64
import hashlib
import hmac
import itertools
import json
import secrets
import sys
from collections import OrderedDict, deque

import anyio
from mcp import types
from mcp.server import NotificationOptions, Server
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, PromptsListChanged, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415408d763f8cfc0000003"
        "010100c9fe92ef0000000049454e44ae426082"
    )
).decode()
# A WAV header with no samples: the smallest audio there is.
WAV = base64.b64encode(
    b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00D\xac\x00\x00"
    b"\x88X\x01\x00\x02\x00\x10\x00data\x00\x00\x00\x00"
).decode()
STATE_KEY = secrets.token_bytes(32)
PUSH = "--push" in sys.argv[2:]
MISSING_CAPABILITY = -32021
NO_ARGUMENTS = {"type": "object", "properties": {}}
SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}


def _tool(name: str, description: str, schema: dict | None = None) -> types.Tool:
    return types.Tool(name=name, description=description, input_schema=schema or NO_ARGUMENTS)


def _string_arguments(*names: str) -> dict:
    return {"type": "object", "properties": {n: {"type": "string"} for n in names}, "required": list(names)}


TOOLS = [
    _tool("test_simple_text", "Returns simple text"),
    _tool("test_image_content", "Returns an image"),
    _tool("test_audio_content", "Returns audio"),
    _tool("test_embedded_resource", "Returns an embedded resource"),
    _tool("test_multiple_content_types", "Returns text, an image and a resource"),
    _tool("test_tool_with_logging", "Logs three messages while it runs"),
    _tool("test_tool_with_progress", "Reports progress 0, 50 and 100 of 100"),
    _tool("test_error_handling", "Always fails"),
    _tool("test_sampling", "Asks the client's model", _string_arguments("prompt")),
    _tool("test_elicitation", "Asks the user", _string_arguments("message")),
    _tool("test_elicitation_sep1034_defaults", "Asks the user, with defaults"),
    _tool("test_elicitation_sep1330_enums", "Asks the user to choose"),
    _tool("json_schema_2020_12_tool", "A tool with JSON Schema 2020-12 features", SCHEMA_2020_12),
    _tool("test_logging_tool", "Logs only when the request asked for a log level"),
    _tool("test_missing_capability", "Needs the client's sampling capability"),
    _tool("test_streaming_elicitation", "Asks the user through an input-required result"),
    _tool("test_input_required_result_elicitation", "Asks the user's name"),
    _tool("test_input_required_result_sampling", "Asks the client's model"),
    _tool("test_input_required_result_list_roots", "Asks for the client's roots"),
    _tool("test_input_required_result_request_state", "Round-trips a requestState"),
    _tool("test_input_required_result_multiple_inputs", "Asks three things at once"),
    _tool("test_input_required_result_multi_round", "Asks in two rounds"),
    _tool("test_input_required_result_tampered_state", "Refuses a tampered requestState"),
    _tool("test_input_required_result_capabilities", "Asks only what the client declared"),
    _tool("test_reconnection", "Closes the call's SSE stream before it answers (the client resumes it)"),
    _tool(
        "test_custom_headers",
        "Takes its region as an Mcp-Param header too (SEP-2243)",
        {
            "type": "object",
            "properties": {"region": {"type": "string", "x-mcp-header": "Region"}},
            "required": ["region"],
        },
    ),
    _tool("test_trigger_tool_change", "Changes test_changing_tool's description, and says the tool list changed"),
    _tool("test_trigger_prompt_change", "Tells listening clients that the prompt list changed"),
]


def _text(text: str, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=is_error)


def _elicit(message: str, properties: dict, required: list[str]) -> types.ElicitRequest:
    schema = {"type": "object", "properties": properties, "required": required}
    return types.ElicitRequest(params=types.ElicitRequestFormParams(message=message, requested_schema=schema))


def _sample(text: str, max_tokens: int) -> types.CreateMessageRequest:
    message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=text))
    return types.CreateMessageRequest(
        params=types.CreateMessageRequestParams(messages=[message], max_tokens=max_tokens)
    )


def _sign(state: dict) -> str:
    body = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
    return f"{body}.{hmac.new(STATE_KEY, body.encode(), hashlib.sha256).hexdigest()}"


def _verified(token: str | None) -> dict:
    body, _, mac = (token or "").partition(".")
    if not hmac.compare_digest(mac, hmac.new(STATE_KEY, body.encode(), hashlib.sha256).hexdigest()):
        raise MCPError(types.INVALID_PARAMS, "Invalid requestState: integrity check failed")
    return json.loads(base64.urlsafe_b64decode(body))


def _declared(ctx, capability: str) -> bool:
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and getattr(capabilities, capability, None) is not None


async def _ask(ctx, params, request, push: bool = False) -> types.Result:
    """One server-to-client request in the caller's era: on the call's stream, or as an input-required
    round (the answer then comes back in the retry's inputResponses under `answer`); on the stream in
    either era if `push`."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and not push:
        answer = (params.input_responses or {}).get("answer")
        if answer is None:
            return types.InputRequiredResult(input_requests={"answer": request})
        return answer
    result_type = {"elicitation/create": types.ElicitResult, "sampling/createMessage": types.CreateMessageResult}
    related = ServerMessageMetadata(related_request_id=ctx.request_id)
    return await ctx.session.send_request(request, result_type[request.method], metadata=related)


async def _logging(ctx) -> types.CallToolResult:
    for message in ("Tool execution started", "Tool processing data", "Tool execution completed"):
        await ctx.session.send_log_message("info", message, "conformance", related_request_id=ctx.request_id)
        await anyio.sleep(0.05)
    return _text("Logging completed")


async def _progress(ctx) -> types.CallToolResult:
    for step in (0, 50, 100):
        await ctx.session.report_progress(step, 100)
        if step < 100:
            await anyio.sleep(0.05)
    return _text("Progress completed")


def _input_required(params, name: str) -> types.Result:
    """The 2026-07-28 input-required fixtures (SEP-2322)."""
    responses = params.input_responses or {}
    if name == "test_input_required_result_elicitation":
        if "user_name" not in responses:
            ask = _elicit("What is your name?", {"name": {"type": "string"}}, ["name"])
            return types.InputRequiredResult(input_requests={"user_name": ask})
        return _text(f"Hello, {(getattr(responses['user_name'], 'content', None) or {}).get('name', 'stranger')}!")
    if name == "test_input_required_result_sampling":
        if "capital_question" not in responses:
            ask = _sample("What is the capital of France?", 100)
            return types.InputRequiredResult(input_requests={"capital_question": ask})
        return _text(f"The model said: {getattr(responses['capital_question'].content, 'text', '')}")
    if name == "test_input_required_result_list_roots":
        if "client_roots" not in responses:
            return types.InputRequiredResult(input_requests={"client_roots": types.ListRootsRequest()})
        roots = [str(root.uri) for root in responses["client_roots"].roots]
        return _text(f"Roots: {', '.join(roots) or 'none'}")
    if name in ("test_input_required_result_request_state", "test_input_required_result_tampered_state"):
        if params.request_state is None:
            ask = _elicit("Please confirm", {"ok": {"type": "boolean"}}, ["ok"])
            state = _sign({"tool": name, "round": 1})
            return types.InputRequiredResult(input_requests={"confirm": ask}, request_state=state)
        if _verified(params.request_state).get("tool") != name:
            raise MCPError(types.INVALID_PARAMS, "Invalid requestState: issued for another tool")
        return _text("state-ok: confirmed")
    if name == "test_input_required_result_multiple_inputs":
        keys = ("user_name", "greeting", "client_roots")
        if params.request_state is None or not all(key in responses for key in keys):
            requests = {
                "user_name": _elicit("What is your name?", {"name": {"type": "string"}}, ["name"]),
                "greeting": _sample("Generate a greeting", 50),
                "client_roots": types.ListRootsRequest(),
            }
            return types.InputRequiredResult(input_requests=requests, request_state=_sign({"tool": name}))
        _verified(params.request_state)
        return _text("All three inputs received")
    if name == "test_input_required_result_multi_round":
        round_ = _verified(params.request_state).get("round", 0) if params.request_state else 0
        if round_ == 0 or "step1" not in responses and round_ == 1:
            ask = _elicit("Step 1: What is your name?", {"name": {"type": "string"}}, ["name"])
            return types.InputRequiredResult(input_requests={"step1": ask}, request_state=_sign({"round": 1}))
        if round_ == 1 or "step2" not in responses:
            ask = _elicit("Step 2: What is your favorite color?", {"color": {"type": "string"}}, ["color"])
            return types.InputRequiredResult(input_requests={"step2": ask}, request_state=_sign({"round": 2}))
        return _text("Both steps completed")
    raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {name}")


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.Result:
    name, args = params.name, params.arguments or {}
    match name:
        case "test_simple_text":
            return _text("This is a simple text response for testing.")
        case "test_image_content":
            return types.CallToolResult(content=[types.ImageContent(type="image", data=PNG, mime_type="image/png")])
        case "test_audio_content":
            return types.CallToolResult(content=[types.AudioContent(type="audio", data=WAV, mime_type="audio/wav")])
        case "test_embedded_resource":
            resource = types.TextResourceContents(
                uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."
            )
            return types.CallToolResult(content=[types.EmbeddedResource(type="resource", resource=resource)])
        case "test_multiple_content_types":
            resource = types.TextResourceContents(
                uri="test://mixed-content-resource",
                mime_type="application/json",
                text=json.dumps({"test": "data", "value": 123}),
            )
            return types.CallToolResult(
                content=[
                    types.TextContent(type="text", text="Multiple content types test:"),
                    types.ImageContent(type="image", data=PNG, mime_type="image/png"),
                    types.EmbeddedResource(type="resource", resource=resource),
                ]
            )
        case "test_tool_with_logging" | "test_logging_tool":
            return await _logging(ctx)
        case "test_tool_with_progress":
            return await _progress(ctx)
        case "test_error_handling":
            return _text("This tool intentionally returns an error for testing", is_error=True)
        case "json_schema_2020_12_tool":
            return _text("ok")
        case "test_sampling":
            answer = await _ask(ctx, params, _sample(str(args.get("prompt", "")), 100), PUSH)
            if isinstance(answer, types.InputRequiredResult):
                return answer
            return _text(f"LLM response: {getattr(answer.content, 'text', '')}")
        case "test_elicitation" | "test_elicitation_sep1034_defaults" | "test_elicitation_sep1330_enums":
            answer = await _ask(ctx, params, ELICITATIONS[name](args), PUSH)
            if isinstance(answer, types.InputRequiredResult):
                return answer
            return _text(f"User response: action={answer.action}, content={json.dumps(answer.content)}")
        case "test_missing_capability":
            if not _declared(ctx, "sampling"):
                needs = {"requiredCapabilities": {"sampling": {}}}
                raise MCPError(MISSING_CAPABILITY, "This tool needs the sampling capability.", needs)
            return _text("sampling declared")
        case "test_streaming_elicitation":
            answer = await _ask(ctx, params, _elicit("Anything to add?", {"note": {"type": "string"}}, []))
            return answer if isinstance(answer, types.InputRequiredResult) else _text(f"action={answer.action}")
        case "test_custom_headers":
            return _text(f"region: {args.get('region', '')}")
        case "test_reconnection":
            if ctx.close_sse_stream is not None:
                await ctx.close_sse_stream()
            await anyio.sleep(0.2)
            return _text("Reconnection test completed successfully")
        case "test_trigger_tool_change" | "test_trigger_prompt_change":
            tools = name == "test_trigger_tool_change"
            if tools:
                CHANGED[0] = not CHANGED[0]
            if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                await changes.publish(ToolsListChanged() if tools else PromptsListChanged())
            else:
                await (ctx.session.send_tool_list_changed() if tools else ctx.session.send_prompt_list_changed())
            return _text("changed")
        case "test_input_required_result_capabilities":
            requests = {}
            if _declared(ctx, "sampling"):
                requests["model"] = _sample("Say hello", 20)
            if _declared(ctx, "elicitation"):
                requests["user"] = _elicit("Say hello", {"hello": {"type": "string"}}, [])
            if requests and not (params.input_responses or {}):
                return types.InputRequiredResult(input_requests=requests)
            return _text("Declared capabilities respected")
    return _input_required(params, name)


ELICITATIONS = {
    "test_elicitation": lambda args: _elicit(
        str(args.get("message", "")),
        {
            "username": {"type": "string", "description": "User's response"},
            "email": {"type": "string", "description": "User's email address"},
        },
        ["username", "email"],
    ),
    "test_elicitation_sep1034_defaults": lambda args: _elicit(
        "Please review and update the form fields with defaults",
        {
            "name": {"type": "string", "description": "User name", "default": "John Doe"},
            "age": {"type": "integer", "description": "User age", "default": 30},
            "score": {"type": "number", "description": "User score", "default": 95.5},
            "status": {
                "type": "string",
                "description": "User status",
                "enum": ["active", "inactive", "pending"],
                "default": "active",
            },
            "verified": {"type": "boolean", "description": "Verification status", "default": True},
        },
        [],
    ),
    "test_elicitation_sep1330_enums": lambda args: _elicit(
        "Please choose",
        {
            "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
            "titledSingle": {
                "type": "string",
                "oneOf": [
                    {"const": "value1", "title": "First Option"},
                    {"const": "value2", "title": "Second Option"},
                    {"const": "value3", "title": "Third Option"},
                ],
            },
            "legacyEnum": {
                "type": "string",
                "enum": ["opt1", "opt2", "opt3"],
                "enumNames": ["Option One", "Option Two", "Option Three"],
            },
            "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
            "titledMulti": {
                "type": "array",
                "items": {
                    "anyOf": [
                        {"const": "value1", "title": "First Choice"},
                        {"const": "value2", "title": "Second Choice"},
                        {"const": "value3", "title": "Third Choice"},
                    ]
                },
            },
        },
        [],
    ),
}

RESOURCES = {
    "test://static-text": ("Static Text Resource", "A static text resource for testing", "text/plain"),
    "test://static-binary": ("Static Binary Resource", "A static binary resource (image) for testing", "image/png"),
    "test://watched-resource": ("Watched Resource", "A resource that can be subscribed to", "text/plain"),
}
TEXTS = {
    "test://static-text": "This is the content of the static text resource.",
    "test://watched-resource": "Watched resource content",
}


# The tool test_trigger_tool_change changes: the list really changes (a gateway that pins tools withdraws it
# until approved, and brings it back when it changes back), so a client re-listing sees what it was told.
CHANGED = [False]


async def list_tools(ctx, params) -> types.ListToolsResult:
    description = "Changed by test_trigger_tool_change" + (" (changed)" if CHANGED[0] else "")
    return types.ListToolsResult(tools=[*TOOLS, _tool("test_changing_tool", description)])


async def list_resources(ctx, params) -> types.ListResourcesResult:
    resources = [
        types.Resource(uri=uri, name=name, description=description, mime_type=mime)
        for uri, (name, description, mime) in RESOURCES.items()
    ]
    return types.ListResourcesResult(resources=resources)


async def list_resource_templates(ctx, params) -> types.ListResourceTemplatesResult:
    template = types.ResourceTemplate(
        uri_template="test://template/{id}/data",
        name="Resource Template",
        description="A resource template with parameter substitution",
        mime_type="application/json",
    )
    return types.ListResourceTemplatesResult(resource_templates=[template])


async def read_resource(ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    uri = str(params.uri)
    if uri == "test://static-binary":
        contents = [types.BlobResourceContents(uri=uri, mime_type="image/png", blob=PNG)]
    elif uri in TEXTS:
        contents = [types.TextResourceContents(uri=uri, mime_type="text/plain", text=TEXTS[uri])]
    elif uri.startswith("test://template/") and uri.endswith("/data"):
        id_ = uri.removeprefix("test://template/").removesuffix("/data")
        text = json.dumps({"id": id_, "templateTest": True, "data": f"Data for ID: {id_}"}, separators=(",", ":"))
        contents = [types.TextResourceContents(uri=uri, mime_type="application/json", text=text)]
    else:
        raise MCPError(types.INVALID_PARAMS, f"Resource not found: {uri}", {"uri": uri})
    return types.ReadResourceResult(contents=contents)


async def subscribe(ctx, params) -> types.EmptyResult:
    return types.EmptyResult()


PROMPTS = [
    types.Prompt(name="test_simple_prompt", description="A simple prompt without arguments"),
    types.Prompt(
        name="test_prompt_with_arguments",
        description="A prompt with required arguments",
        arguments=[
            types.PromptArgument(name="arg1", description="First test argument", required=True),
            types.PromptArgument(name="arg2", description="Second test argument", required=True),
        ],
    ),
    types.Prompt(
        name="test_prompt_with_embedded_resource",
        description="A prompt that embeds a resource",
        arguments=[types.PromptArgument(name="resourceUri", description="URI of the resource", required=True)],
    ),
    types.Prompt(name="test_prompt_with_image", description="A prompt with an image"),
    types.Prompt(name="test_input_required_result_prompt", description="A prompt that asks for context first"),
]


def _user(content) -> types.PromptMessage:
    return types.PromptMessage(role="user", content=content)


async def get_prompt(ctx, params: types.GetPromptRequestParams) -> types.Result:
    args = params.arguments or {}
    match params.name:
        case "test_simple_prompt":
            messages = [_user(types.TextContent(type="text", text="This is a simple prompt for testing."))]
        case "test_prompt_with_arguments":
            text = f"Prompt with arguments: arg1='{args.get('arg1', '')}', arg2='{args.get('arg2', '')}'"
            messages = [_user(types.TextContent(type="text", text=text))]
        case "test_prompt_with_embedded_resource":
            resource = types.TextResourceContents(
                uri=args.get("resourceUri", "test://example-resource"),
                mime_type="text/plain",
                text="Embedded resource content for testing.",
            )
            messages = [
                _user(types.EmbeddedResource(type="resource", resource=resource)),
                _user(types.TextContent(type="text", text="Please process the embedded resource above.")),
            ]
        case "test_prompt_with_image":
            messages = [
                _user(types.ImageContent(type="image", data=PNG, mime_type="image/png")),
                _user(types.TextContent(type="text", text="Please analyze the image above.")),
            ]
        case "test_input_required_result_prompt":
            answer = (params.input_responses or {}).get("user_context")
            if answer is None:
                ask = _elicit("What context should the prompt use?", {"context": {"type": "string"}}, ["context"])
                return types.InputRequiredResult(input_requests={"user_context": ask})
            context = (getattr(answer, "content", None) or {}).get("context", "")
            messages = [_user(types.TextContent(type="text", text=f"Use this context: {context}"))]
        case _:
            raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {params.name}")
    return types.GetPromptResult(messages=messages)


async def complete(ctx, params: types.CompleteRequestParams) -> types.CompleteResult:
    words = ["paris", "park", "party"]
    values = [w for w in words if w.startswith(params.argument.value)]
    return types.CompleteResult(completion=types.Completion(values=values, total=len(values), has_more=False))


async def set_level(ctx, params) -> types.EmptyResult:
    return types.EmptyResult()


changes = InMemorySubscriptionBus()


class ConformanceServer(Server):
    def create_initialization_options(self, notification_options=None, *args, **kwargs):
        options = NotificationOptions(tools_changed=True, prompts_changed=True, resources_changed=True)
        return super().create_initialization_options(options, *args, **kwargs)


server = ConformanceServer(
    "mcp-conformance-test-server",
    version="1.0.0",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_resources=list_resources,
    on_list_resource_templates=list_resource_templates,
    on_read_resource=read_resource,
    on_subscribe_resource=subscribe,
    on_unsubscribe_resource=subscribe,
    on_list_prompts=lambda ctx, params: _prompts(),
    on_get_prompt=get_prompt,
    on_completion=complete,
    on_set_logging_level=set_level,
    on_subscriptions_listen=ListenHandler(changes),
)


async def _prompts() -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=PROMPTS)


class RecentEvents(EventStore):
    """The newest events of each stream, for clients that resume with Last-Event-ID (bounded in count)."""

    def __init__(self, max_events: int) -> None:
        self._max_events = max_events
        self._streams: dict[StreamId, OrderedDict[EventId, types.JSONRPCMessage | None]] = {}
        self._order: deque[tuple[StreamId, EventId]] = deque()  # every kept event, oldest first
        self._ids = itertools.count()

    async def store_event(self, stream_id: StreamId, message: types.JSONRPCMessage | None) -> EventId:
        event_id = f"{stream_id}:{next(self._ids)}"
        self._streams.setdefault(stream_id, OrderedDict())[event_id] = message
        self._order.append((stream_id, event_id))
        while len(self._order) > self._max_events:
            old_stream, old_event = self._order.popleft()
            events = self._streams.get(old_stream)
            if events is not None:
                events.pop(old_event, None)
                if not events:
                    del self._streams[old_stream]
        return event_id

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        stream_id = last_event_id.rpartition(":")[0]
        events = self._streams.get(stream_id)
        if events is None or last_event_id not in events:
            return None
        after = False
        for event_id, message in list(events.items()):
            if after and message is not None:  # priming events carry no message
                await send_callback(EventMessage(message, event_id))
            after = after or event_id == last_event_id
        return stream_id


if __name__ == "__main__":
    import uvicorn

    app = server.streamable_http_app(event_store=RecentEvents(1000), retry_interval=500)  # resumable streams
    # h11 trims the whitespace around header values, as HTTP says to (httptools leaves it, which the suite fails).
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", http="h11")
