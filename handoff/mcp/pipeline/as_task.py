"""A call made as a task (2025-11-25's experimental tasks): a client that declared the `tasks` capability and
augments a tools/call with `task` is answered at once with a task, `working`, once the call waits for a person's
sign-off; the call goes on in the background on the serving loop (its wait bounded by the sign-off request's), and
its outcome is kept for `tasks/result`. A call that never waits (no sign-off asked, a grant at hand, a refusal at
once) is answered as it would be without the task. The process that takes the call runs it (task_state.py) and
writes where it stands as a row (tool_task.py), which the session's other processes answer from."""

import asyncio
import logging
from typing import Any

from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from gateway_project.lib.database import database_async
from gateway_project.lib.task_failures import failure_logger
from handoff.mcp.caller import legacy_agent
from handoff.mcp.pipeline.answer import agent_answer
from handoff.mcp.pipeline.call import Call
from handoff.mcp.pipeline.run import call_serve
from handoff.mcp.pipeline.task_state import COMPLETED, FAILED, CallTask, TaskCancelled, TaskCreated, forget, task_open
from handoff.mcp.pipeline.tool_task import legacy_end, legacy_open

logger = logging.getLogger(__name__)
_log_failure = failure_logger(logger, "tools/call task")


def tasks_declared(ctx: ServerRequestContext) -> bool:
    """Whether the request comes from a 2025-11-25 client that declared the `tasks` capability."""
    if not legacy_agent(ctx):
        return False
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and capabilities.tasks is not None


async def call_as_task(call: Call, ttl_ms: int | None) -> Any:
    """The call's answer, or TaskCreated once it waits for a sign-off (the call then runs on as the task)."""
    assert call.caller is not None
    task = task_open(call.caller, ttl_ms)
    if task is None:
        return await call_serve(call, agent_answer)
    call.task = task
    task.runner = asyncio.create_task(_run(call, task), name=f"task-{task.task_id}")
    task.runner.add_done_callback(_log_failure)
    asked = asyncio.create_task(task.asked.wait())
    try:
        await asyncio.wait((task.runner, asked), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # its client cancelled the request before it became a task
        task.runner.cancel()
        forget(task)
        raise
    finally:
        asked.cancel()
    if task.asked.is_set():
        try:
            await database_async(legacy_open)(task, call.caller, call.name)  # before the client can ask elsewhere
        finally:
            task.written.set()
        raise TaskCreated(task.task_id, {"task": task.wire()})
    forget(task)  # it never waited: answered as without a task
    if task.error is not None:
        raise MCPError.from_error_data(task.error)
    return task.result


async def _run(call: Call, task: CallTask) -> None:
    await _ran(call, task)
    if task.asked.is_set():  # a task: where it ended, for the session's other processes, once its row is there
        await task.written.wait()
        await database_async(legacy_end)(task)


async def _ran(call: Call, task: CallTask) -> None:
    try:
        result = await call_serve(call, agent_answer)
    except TaskCancelled:
        return
    except asyncio.CancelledError:  # the process stops, or the request was cancelled before it became a task
        stopped = "The call was stopped before it ended."
        task.end(FAILED, stopped, error=types.ErrorData(code=types.INTERNAL_ERROR, message=stopped))
        raise
    except MCPError as refused:
        task.end(FAILED, refused.error.message, error=refused.error)
        return
    except Exception:
        logger.exception("a tools/call task failed")
        error = types.ErrorData(code=types.INTERNAL_ERROR, message="Internal error")
        task.end(FAILED, "The gateway failed to run the call.", error=error)
        return
    task.end(COMPLETED, "", result=result)
