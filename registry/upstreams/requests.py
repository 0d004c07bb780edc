"""What the pool sends an upstream on a session, each as a function of the connection (its SDK client, and a stdio
server's direct line): tool calls, forwarded requests, the catalog's listing. Every result leaves as plain JSON,
without the upstream's serverInfo."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from mcp import types
from mcp.client.session import _later_revision_fields
from mcp_types.methods import SERVER_RESULTS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter

from registry.upstreams.offers import offers
from registry.upstreams.relay import Relay

SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
CALL_TOOL = "tools/call"


@dataclass(frozen=True)
class UpstreamRequest:
    """One agent request for an upstream as it travels down the call path: from the MCP layer through the
    executor (as a Celery task's kwargs, in Celery mode) to the pool. `method` is tools/call (its `params`
    {"name", "arguments"}, as on the wire) or one FORWARDED below."""

    upstream_id: int
    revision: int
    method: str
    params: dict[str, Any]
    timeout: float = 0.0  # the upstream's: how long a caller waits for it (audit/outcomes.py call_deadline)
    traceparent: str = ""  # the gateway's span, the upstream's parent
    rounds: dict[str, Any] | None = None  # a 2026-07-28 agent's input rounds (see `calling`)
    person: dict[str, Any] | None = None  # whose credential, on a per-person upstream (registry/personal.py)
    legacy: bool = False  # the agent speaks 2025-11-25: so does its plain call, where the upstream can (pool.py)

    @classmethod
    def tool_call(
        cls, upstream_id: int, revision: int, tool: str, arguments: dict[str, Any], **rest: Any
    ) -> "UpstreamRequest":
        return cls(upstream_id, revision, CALL_TOOL, {"name": tool, "arguments": arguments}, **rest)


def _wire(result: Any) -> dict[str, Any]:
    """A result as JSON, without the upstream's serverInfo: agents see one server, the gateway."""
    wire = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    if (meta := wire.pop("_meta", None)) is not None:  # the dump's own dict: changed in place, put back last
        meta.pop(SERVER_INFO_KEY, None)
        if meta:
            wire["_meta"] = meta
    return wire


INPUT_RESPONSES = TypeAdapter(types.InputResponses)


def _passing(rounds: dict[str, Any]) -> dict[str, Any]:
    """The SDK session's arguments for a request whose input-required result goes back as it is."""
    responses = rounds.get("inputResponses")
    return {
        "input_responses": INPUT_RESPONSES.validate_python(responses) if responses is not None else None,
        "request_state": rounds.get("requestState"),
        "allow_input_required": True,
    }


# What the pool sends on a session: a function of the connection (connection.py: its SDK client, and its direct
# line to a stdio server) and of the call's relay, through which the upstream's progress travels to the agent
# (the pool's relay, which blanks the upstream's credentials out).
Action = Callable[[Any, Relay | None], Awaitable[dict[str, Any]]]
# What a tools/call may answer: a result, or (2026-07-28) the input it needs first. The SDK session's union.
CALL_TOOL_RESULT = TypeAdapter(types.CallToolResult | types.InputRequiredResult)


@cache
def _era_result(version: str) -> TypeAdapter[Any]:
    """A tools/call result's wire schema in `version`'s era: the check of mcp_types' `validate_server_result`
    without the dump it makes and throws away (about 3 us of CPU a call), which cannot fail once the JSON it
    dumps is valid: the era's models have plain JSON fields and no serializers of their own."""
    return TypeAdapter(SERVER_RESULTS[(CALL_TOOL, version)])


def calling(
    tool: str,
    arguments: dict[str, Any],
    traceparent: str = "",
    rounds: dict[str, Any] | None = None,
) -> Action:
    """The call. With `rounds` (a 2026-07-28 agent's: {} or the `inputResponses` and upstream `requestState`
    of its retry), a 2026-07-28 upstream's input-required result comes back as it is, for the agent to
    answer; otherwise the SDK client answers each round through the relay's callbacks. A call that relays
    nothing to a stdio server goes by its direct line (`_direct`)."""
    sent_meta = {"traceparent": traceparent} if traceparent else None  # the gateway's span, the upstream's parent

    async def call(connection: Any, relay: Relay | None) -> dict[str, Any]:
        client = connection.client
        if relay is None and rounds is None and connection.direct.open:
            return _wire(await _direct(connection, tool, arguments, sent_meta))
        on_progress = relay.progress if relay else None
        if rounds is not None and client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            passing = _passing(rounds)
            return _wire(
                await client.session.call_tool(
                    tool, arguments, meta=sent_meta, progress_callback=on_progress, **passing
                )
            )
        return _wire(await client.call_tool(tool, arguments, meta=sent_meta, progress_callback=on_progress))

    return call


async def _direct(connection: Any, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None) -> Any:
    """The call by the connection's direct line, its answer checked as the SDK client checks its own: the
    era's result schema, the result's type, the tool's output schema; an input-required answer's rounds
    are answered by the SDK client's own driver, its retries sent through the session."""
    client = connection.client
    params = {"name": tool, "arguments": arguments} | ({"_meta": dict(meta)} if meta else {})
    raw = await connection.direct.request(client.session, CALL_TOOL, params)
    _era_result(client.protocol_version).validate_python(raw, by_name=False)
    # A later era's fields are outside the session's (a 2025-11-25 upstream's resultType is no input round).
    if not (later := _later_revision_fields(CALL_TOOL, client.protocol_version)).isdisjoint(raw):
        raw = {key: value for key, value in raw.items() if key not in later}
    result = CALL_TOOL_RESULT.validate_python(raw, by_name=False)
    if isinstance(result, types.InputRequiredResult):

        async def retry(responses: Any, state: str | None) -> Any:
            return await client.session.call_tool(
                tool, arguments, meta=meta, input_responses=responses, request_state=state, allow_input_required=True
            )

        result = await client._drive_input_required(result, retry)
    if not result.is_error:
        await client.session.validate_tool_result(tool, result)
    return result


def _complete(client: Any, params: types.CompleteRequestParams) -> Awaitable[Any]:
    context = params.context.arguments if params.context else None
    return client.complete(params.ref, params.argument.model_dump(), context)


# The requests passed through as they are, with the capability the upstream must have declared for each.
# Lists bypass the client's response cache: the gateway keeps its own view fresh.
FORWARDED: dict[str, tuple[str, type, Callable[[Any, Any], Awaitable[Any]]]] = {
    "resources/list": (
        "resources",
        types.PaginatedRequestParams,
        lambda c, p: c.list_resources(cursor=p.cursor, cache_mode="bypass"),
    ),
    "resources/templates/list": (
        "resources",
        types.PaginatedRequestParams,
        lambda c, p: c.list_resource_templates(cursor=p.cursor, cache_mode="bypass"),
    ),
    "resources/read": ("resources", types.ReadResourceRequestParams, lambda c, p: c.read_resource(p.uri)),
    "prompts/list": (
        "prompts",
        types.PaginatedRequestParams,
        lambda c, p: c.list_prompts(cursor=p.cursor, cache_mode="bypass"),
    ),
    "prompts/get": ("prompts", types.GetPromptRequestParams, lambda c, p: c.get_prompt(p.name, p.arguments)),
    "completion/complete": ("completions", types.CompleteRequestParams, _complete),
    "resources/subscribe": ("resources", types.SubscribeRequestParams, lambda c, p: c.subscribe_resource(p.uri)),
    "resources/unsubscribe": (
        "resources",
        types.UnsubscribeRequestParams,
        lambda c, p: c.unsubscribe_resource(p.uri),
    ),
}
UNSUPPORTED = "UPSTREAM_UNSUPPORTED"


# The forwarded requests a 2026-07-28 upstream may answer with an input-required result.
IN_ROUNDS: dict[str, Callable[..., Awaitable[Any]]] = {
    "prompts/get": lambda c, p, passing: c.session.get_prompt(p.name, p.arguments, **passing),
    "resources/read": lambda c, p, passing: c.session.read_resource(p.uri, **passing),
}


def forwarding(method: str, params: dict[str, Any], rounds: dict[str, Any] | None = None) -> Action:
    capability, params_type, send = FORWARDED[method]

    async def forward(connection: Any, relay: Relay | None) -> dict[str, Any]:
        client = connection.client
        if getattr(client.server_capabilities, capability, None) is None:
            raise Unsupported(method)
        typed = params_type.model_validate(params)
        if rounds is not None and method in IN_ROUNDS and client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return _wire(await IN_ROUNDS[method](client, typed, _passing(rounds)))
        return _wire(await send(client, typed))

    return forward


class Unsupported(Exception):
    """The upstream did not declare the capability a forwarded request needs."""


async def catalog(connection: Any, relay: Relay | None) -> dict[str, Any]:
    """What catalog sync keeps: every tool, what the upstream says of itself (era, instructions), and its
    resources, resource templates and prompts (offers.py)."""
    client = connection.client
    tools = await list_every_page(client)
    said = {"protocolVersion": client.protocol_version, "instructions": client.instructions or ""}
    return {"tools": tools} | said | await offers(client)


async def tools_listed(connection: Any, relay: Relay | None) -> dict[str, Any]:
    """A health probe's question: the tools alone, the cheapest answer that shows the upstream serves."""
    return {"tools": await list_every_page(connection.client)}


async def list_every_page(client: Any) -> list[dict[str, Any]]:
    tools, cursor = [], None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools += [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in page.tools]
        if not (cursor := page.next_cursor):
            return tools
