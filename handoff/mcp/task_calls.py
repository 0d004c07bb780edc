"""Tasks of calls that wait for sign-off, in both eras: 2025-11-25's experimental tasks (handoff/mcp/pipeline/
as_task.py: the `tasks` capability, tools/call only, and tasks/cancel; tools/list marking the tools a sign-off rule
governs for the caller; `tasks/get`, `tasks/result` and `tasks/cancel`) and 2026-07-28's Tasks extension
(handoff/mcp/pipeline/tool_task.py: `tasks/get`, `tasks/update` and `tasks/cancel`), each for the caller's own
tasks only."""

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field

from gateway_project.lib.database import database_async
from handoff.mcp.caller import caller_of, legacy_agent, request_span
from handoff.mcp.list_changed import relay_everywhere, relay_handlers
from handoff.mcp.pipeline.as_task import tasks_declared
from handoff.mcp.pipeline.task_state import CANCELLED, RELATED_TASK, CallTask, TaskCreated, task_find, task_held
from handoff.mcp.pipeline.tool_task import legacy_cancel, legacy_find, task_cancel, task_get, task_update
from handoff.snapshot import Snapshot

CAPABILITY = types.ServerTasksCapability(
    cancel=types.TasksCancelCapability(),
    requests=types.ServerTasksRequestsCapability(tools=types.TasksToolsCapability(call=types.TasksCallCapability())),
)
OPTIONAL = {"taskSupport": "optional"}
LEGACY_ONLY = frozenset({"tasks/result"})  # 2026-07-28's extension polls tasks/get for the result
MODERN_ONLY = frozenset({"tasks/update"})
CANCEL = "task.cancel"  # the relay's message: {"type": CANCEL, "id": <task id>}, to the process that runs it
ROW_POLL_SECONDS = 1.0  # how often tasks/result reads the row of a task another process runs


class TaskAnswers:
    """Server middleware: a tools/call that became a task answers its CreateTaskResult (which the SDK's check of a
    handler's tools/call result, made for CallToolResult only, would refuse). A tasks/* method of one era only does
    not exist in the other, before its params are read (as the SDK says of any unserved one)."""

    async def __call__(self, ctx: ServerRequestContext, call_next: Callable[[ServerRequestContext], Any]) -> Any:
        modern = not legacy_agent(ctx)
        if ctx.method in (LEGACY_ONLY if modern else MODERN_ONLY):
            raise MCPError(types.METHOD_NOT_FOUND, "Method not found", ctx.method)
        try:
            return await call_next(ctx)
        except TaskCreated as created:
            return created.result


def tools_marked(ctx: ServerRequestContext, snap: Snapshot, tools: Sequence[Any]) -> Sequence[Any]:
    """The tools as a client that declared tasks sees them: those a person signs off may be called as tasks, and
    no other (the gateway makes no task of an upstream's, whatever the upstream says of its own)."""
    if not tasks_declared(ctx):
        return tools
    who = caller_of(ctx).who
    return [_marked(tool, _signed_off_by_others(snap, who, tool["name"])) for tool in tools]


def _signed_off_by_others(snap: Snapshot, who: Any, name: str) -> bool:
    entry = snap.tool(who, name)  # none for the gateway's own tools
    terms = snap.sign_off(who, entry) if entry is not None else None
    return terms is not None and terms.signers is not None


def _marked(tool: dict[str, Any], task: bool) -> dict[str, Any]:
    execution = {key: value for key, value in (tool.get("execution") or {}).items() if key != "taskSupport"}
    execution |= OPTIONAL if task else {}
    return {key: value for key, value in tool.items() if key != "execution"} | (
        {"execution": execution} if execution else {}
    )


async def get_task(ctx: ServerRequestContext, params: types.GetTaskRequestParams) -> dict[str, Any]:
    with request_span(ctx, "tasks/get"):
        if not legacy_agent(ctx):
            return await task_get(ctx, params.task_id)
        return (await _task(ctx, params.task_id)).wire()


class UpdateTaskParams(BaseModel):
    """2026-07-28's `tasks/update` (the extension's; the SDK types none)."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")
    task_id: str = Field(alias="taskId")
    input_responses: dict[str, Any] = Field(default_factory=dict, alias="inputResponses")


async def update_task(ctx: ServerRequestContext, params: UpdateTaskParams) -> dict[str, Any]:
    with request_span(ctx, "tasks/update"):
        return await task_update(ctx, params.task_id)


async def task_result(ctx: ServerRequestContext, params: types.GetTaskPayloadRequestParams) -> dict[str, Any]:
    """The call's own answer once the task has ended (waiting for it until then)."""
    with request_span(ctx, "tasks/result"):
        task = await _task(ctx, params.task_id)
        while not task.here and not task.ended:  # another process runs it: its row says when it ends
            await asyncio.sleep(ROW_POLL_SECONDS)
            task = await _task(ctx, params.task_id)
        await task.done.wait()
        if task.status == CANCELLED:
            raise MCPError(types.INVALID_PARAMS, f"Task {task.task_id!r} was cancelled: it has no result.")
        if task.error is not None:
            raise MCPError(task.error.code, task.error.message, task.error.data)
        assert task.result is not None
        related = {RELATED_TASK: {"taskId": task.task_id}}
        return task.result | {"_meta": (task.result.get("_meta") or {}) | related}


async def cancel_task(ctx: ServerRequestContext, params: types.CancelTaskRequestParams) -> dict[str, Any]:
    """Ends the task. A call still waiting for its sign-off stops (the request stays pending until it expires); one
    already signed off runs to its end, its outcome in the audit trail, its result dropped."""
    with request_span(ctx, "tasks/cancel"):
        if not legacy_agent(ctx):
            return await task_cancel(ctx, params.task_id)
        task = await _task(ctx, params.task_id)
        if task.ended:
            message = f"Task {task.task_id!r} has ended already ({task.status}): it cannot be cancelled."
            raise MCPError(types.INVALID_PARAMS, message)
        task.cancel()
        if not task.here:  # its row says so now; the process that runs it stops its wait
            await database_async(legacy_cancel)(task)
            await relay_everywhere({"type": CANCEL, "id": task.task_id})
        return task.wire()


async def _task(ctx: ServerRequestContext, task_id: str) -> CallTask:
    """The caller's task, as this process runs it or as another's row says it stands."""
    caller = caller_of(ctx)
    task = task_find(caller, task_id) or await database_async(legacy_find)(caller, task_id)
    if task is None:
        raise MCPError(types.INVALID_PARAMS, f"Unknown task {task_id!r}: none of yours has this id.")
    return task


async def _cancelled_elsewhere(message: dict) -> None:
    task = task_held(str(message.get("id")))
    if task is not None:
        task.cancel()


relay_handlers[CANCEL] = _cancelled_elsewhere
