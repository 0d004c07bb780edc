"""Code mode: `search_tools` finds the tools an agent may use, with TypeScript signatures; `execute` runs
the agent's code in the sandbox (handoff/codemode/sandbox.py), where each tool call it makes is decided,
admitted, audited and run through the same pipeline as a direct call (handoff/mcp/pipeline/), its rows naming the
execution's request id. Nothing the agent may not call is found, bound or run."""

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable
from functools import cache
from typing import Any

from django.conf import settings
from mcp.shared.exceptions import MCPError

from audit.outcomes import EXECUTOR_GRACE_SECONDS
from audit.telemetry import code_call_span, current_traceparent
from handoff.codemode.bindings import Bindings, bindings_build
from handoff.codemode.embeddings import model_dir, model_id
from handoff.codemode.sandbox import SandboxError, SandboxLimits, SandboxRun, sandbox_run
from handoff.codemode.search import Embedder, SearchIndex
from handoff.codemode.slots import SandboxSlots
from handoff.codemode.tools import EXECUTE, SEARCH_TOOLS
from handoff.codemode.typescript import method_declaration
from handoff.codemode.vectors import StoredVectors
from handoff.mcp.caller import Caller
from handoff.mcp.pipeline.call import CODE, Call, OwnRun
from handoff.mcp.pipeline.execute import completed
from handoff.mcp.pipeline.results import error_text
from handoff.mcp.pipeline.run import call_serve
from handoff.snapshot import Snapshot, ToolEntry, snapshot
from policy.decisions import INVALID_PARAMS, Denial, ToolRefused, Who
from registry.executor import publish_call, task_send
from registry.naming import gateway_tool_name, split_exposed_name
from registry.upstreams.outcome import Outcome, failure

logger = logging.getLogger(__name__)

MAX_QUERY_CHARS = 1000
DEFAULT_RESULTS = 5


def code_bindings(snap: Snapshot, who: Who) -> Bindings:
    """Every tool as code of the caller's team sees it (a borrowed upstream under the team's local prefix, a virtual
    server's overrides applied), made once per snapshot, team and such server (each caller gets its permitted part)."""
    key = f"bindings:{snap.team_of(who)}:{who.server if snap.server_view(who) else ''}"
    if key not in snap.memo:
        snap.memo[key] = bindings_build(
            [(name, _space(snap, name, e), e.own_name) for name, e in snap.tools_for(who).items()]
        )
    return snap.memo[key]


def _space(snap: Snapshot, name: str, entry: ToolEntry) -> str:
    """What code calls the tool's upstream: its slug, or the team's local prefix for a borrowed one."""
    parts = split_exposed_name(name)
    return entry.route.upstream_slug if snap.tools.get(name) is entry or parts is None else parts[0]


@cache
def _embedder() -> Embedder | None:
    """Semantic ranking, where the embedding model's package is installed and GATEWAY_SEARCH_SEMANTIC allows."""
    if not (settings.GATEWAY_SEARCH_SEMANTIC and model_dir()):
        return None
    return Embedder(StoredVectors(model_id()))


# The catalogs indexed last -> their index: one per way teams name the tools (most teams share the first).
_last_index: dict[tuple[tuple[str, str], ...], SearchIndex] = {}
INDEXES_KEPT = 8


async def search_index(snap: Snapshot, who: Who) -> SearchIndex:
    """The index of the catalog as the caller's team names it: the last one while no tool changed (a new snapshot
    may change only keys or rules, which search applies per query), else built off the event loop, its embeddings
    following in the background."""
    key = f"index:{snap.team_of(who)}:{who.server if snap.server_view(who) else ''}"
    if key not in snap.memo:
        tools = snap.tools_for(who)
        catalog = tuple((name, entry.shape) for name, entry in tools.items())
        if (index := _last_index.get(catalog)) is None:
            index = await asyncio.to_thread(SearchIndex, [entry.definition for entry in tools.values()])
            if (embedder := _embedder()) is not None:
                embedder.start(index)
            while len(_last_index) >= INDEXES_KEPT:
                del _last_index[next(iter(_last_index))]
            _last_index[catalog] = index
        snap.memo.setdefault(key, index)
    return snap.memo[key]


def _invalid(message: str, code: str = "INVALID_ARGUMENTS") -> ToolRefused:
    return ToolRefused(Denial(code, message, INVALID_PARAMS))


async def tools_search(snap: Snapshot, caller: Caller, arguments: dict[str, Any]) -> dict[str, Any]:
    query, k = arguments.get("query"), arguments.get("k", DEFAULT_RESULTS)
    most = settings.GATEWAY_SEARCH_MAX_RESULTS
    if not isinstance(query, str) or not query.strip() or len(query) > MAX_QUERY_CHARS:
        raise _invalid(f"`query` must be a non-empty string of at most {MAX_QUERY_CHARS} characters.")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= most:
        raise _invalid(f"`k` must be a whole number from 1 to {most}.")
    index, embedder = await search_index(snap, caller.who), _embedder()
    vector = await asyncio.to_thread(embedder.query, query) if embedder and index.vectors is not None else None
    hits = index.search(query, k, lambda name: snap.decide(caller.who, name)[0] is None, vector)
    found = [_found(snap, caller, code_bindings(snap, caller.who), name) for name in hits]
    structured = {"tools": found, "ranking": "lexical+semantic" if vector is not None else "lexical"}
    return {"content": [{"type": "text", "text": _listing(query, found)}], "structuredContent": structured}


def _found(snap: Snapshot, caller: Caller, bindings: Bindings, name: str) -> dict[str, Any]:
    entry, binding = snap.tool(caller.who, name), bindings.by_name.get(name)
    assert entry is not None  # the index holds the team's names
    found = {"name": name, "description": entry.definition.get("description") or ""}
    if binding is None:
        return found | {"call": None, "note": f"Not callable from code: {bindings.refused[name]}."}
    signature = method_declaration(binding.path, entry.definition, entry.shape)
    return found | {"call": binding.path, "signature": signature}


def _listing(query: str, found: list[dict[str, Any]]) -> str:
    if not found:
        return f"No tool you may use matches {query!r}."
    execute = gateway_tool_name("execute")
    parts = [f"{len(found)} tools for {query!r}; call them in {execute} as shown, or directly by name."]
    for tool in found:
        parts.append(f"// {tool['name']}\n{tool.get('signature') or tool['note']}")
    return "\n\n".join(parts)


async def execute(caller: Caller, arguments: dict[str, Any], request_id: uuid.UUID, trace_id: str) -> Outcome:
    code = arguments.get("code")
    limit = settings.GATEWAY_SANDBOX_MAX_CODE_BYTES
    if not isinstance(code, str) or not code.strip():
        raise _invalid("`code` must be a non-empty string of TypeScript.")
    if len(code.encode("utf-8", "surrogatepass")) > limit:
        message = f"`code` is larger than {limit} bytes; split the work into several executions."
        raise _invalid(message, "CODE_TOO_LARGE")
    seen = snapshot.latest.version if snapshot.latest else 0  # the configuration this call was admitted on
    execution = {"caller": caller.wire(), "request_id": str(request_id), "trace_id": trace_id, "code": code}
    execution["traceparent"] = current_traceparent()  # its calls' spans are children of this stage's, anywhere
    execution["version"] = seen
    try:
        return await _executed(execution)
    except Exception as exc:  # an outcome all the same, so that the execution gets its completion row
        logger.exception("execution %s failed", request_id)
        message = "The gateway failed while running this code; its tool calls may or may not have run."
        return failure("GATEWAY_ERROR", message, repr(exc))


async def _executed(execution: dict[str, Any]) -> Outcome:
    """In the embedded default, on this process's own loop (the sandbox is a subprocess, its calls go through
    the executor). In Celery mode on a worker of queue `sandbox`, whose code's tool calls go to queue
    `upstream` like any call: a sandbox worker needs no upstream credentials. An agent that leaves cancels the
    execution there."""
    if settings.GATEWAY_EXECUTOR != "celery":
        return await execution_run(execution)
    wait = settings.GATEWAY_SANDBOX_TIMEOUT + EXECUTOR_GRACE_SECONDS
    send = task_send("handoff.run_code", "sandbox")
    return await publish_call("handoff.run_code", {"execution": execution}, wait, None, send)


def sandbox_limits() -> SandboxLimits:
    return SandboxLimits(
        timeout=settings.GATEWAY_SANDBOX_TIMEOUT,
        heap_mb=settings.GATEWAY_SANDBOX_HEAP_MB,
        max_calls=settings.GATEWAY_SANDBOX_MAX_CALLS,
        max_output_bytes=settings.GATEWAY_SANDBOX_MAX_OUTPUT_BYTES,
    )


@cache
def _sandbox_slots() -> SandboxSlots:
    return SandboxSlots(settings.GATEWAY_SANDBOX_MAX_RUNNING, settings.GATEWAY_SANDBOX_MAX_RUNNING_PER_AGENT)


async def execution_run(execution: dict[str, Any]) -> Outcome:
    """Run one execution where the executor put it (this process, or a worker on queue `sandbox`), if a
    sandbox slot is free for its agent."""
    slots, agent_id = _sandbox_slots(), execution["caller"]["agent_id"]
    if refusal := slots.take(agent_id):
        return refusal
    try:
        return await _sandboxed(execution)
    finally:
        slots.give_back(agent_id)


async def _sandboxed(execution: dict[str, Any]) -> Outcome:
    caller = Caller.from_wire(execution["caller"])
    snap = await snapshot.at_least(execution.get("version", 0))
    permitted = code_bindings(snap, caller.who).only(lambda name: snap.decide(caller.who, name)[0] is None)

    async def call(binding: Any, arguments: dict[str, Any]) -> dict[str, Any]:
        return await code_call(caller, execution, binding.exposed_name, arguments)

    try:
        run = await sandbox_run(code=execution["code"], bindings=permitted, call=call, limits=sandbox_limits())
    except SandboxError as error:
        return failure(error.code, error.message, f"{error.message} (after {error.calls} tool calls)")
    return {"ok": True, "result": _result(run)}


def _result(run: SandboxRun) -> dict[str, Any]:
    value = run.value if isinstance(run.value, str) else json.dumps(run.value, ensure_ascii=False)
    content = [{"type": "text", "text": value}]
    if run.logs:
        content.append({"type": "text", "text": "console:\n" + "\n".join(run.logs)})
    return {"content": content}


async def code_call(caller: Caller, execution: dict[str, Any], name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One tool call made by code: the same pipeline as a direct call (so the session's strict-group lock holds
    inside the execution too); its answer for the sandbox."""
    made_by = execution["request_id"]
    try:
        with code_call_span(name, execution.get("traceparent", "")):
            call = Call(name, arguments, execution["trace_id"], origin=CODE, caller=caller, execution=made_by)
            return await call_serve(call, _code_answer)
    except MCPError as refused:  # a row that could not be recorded
        code = (refused.error.data or {}).get("code", "REFUSED")
        return {"ok": False, "error": {"code": code, "message": refused.error.message}}


async def _code_answer(call: Call) -> dict[str, Any]:
    if call.denial:
        return {"ok": False, "error": {"code": call.denial.code, "message": call.denial.message}}
    outcome, result = call.outcome, call.result
    assert outcome is not None and result is not None
    if result.get("isError"):
        return {"ok": False, "error": {"code": outcome.get("code") or "TOOL_ERROR", "message": error_text(result)}}
    return {"ok": True, "value": tool_value(result)}


def tool_value(result: dict[str, Any]) -> Any:
    """What `await tools.x.y()` resolves to: structured content, else a lone text (parsed if it is JSON),
    else the content list."""
    if isinstance(result.get("structuredContent"), dict):
        return result["structuredContent"]
    content = result.get("content") or []
    if len(content) == 1 and content[0].get("type") == "text":
        text = content[0].get("text", "")
        try:
            return json.loads(text)
        except ValueError:
            return text
    return content


def _execute_run(call: Call) -> Awaitable[Outcome]:
    assert call.caller is not None
    return execute(call.caller, call.arguments, call.request_id, call.trace_id)


def _search_run(call: Call) -> Awaitable[Outcome]:
    assert call.snap is not None and call.caller is not None
    return completed(tools_search(call.snap, call.caller, call.arguments))


# Code mode's tools as the pipeline runs them for an agent (the route stage finds them in the snapshot's builtins).
OWN_TOOLS: dict[str, OwnRun] = {EXECUTE: _execute_run, SEARCH_TOOLS: _search_run}
