"""A call made as a task under 2026-07-28's Tasks extension (`io.modelcontextprotocol/tasks`): a client that declares
it on its tools/call gets a task, `working`, instead of `SIGNOFF_PENDING` when the call waits for a sign-off. The
task is a row (handoff.models.ToolTask), so any web process answers its `tasks/get`: while the request is pending,
`working`; once decided, that poll runs the call (granted: it runs; refused: refused with the reason), and the task
ends `completed` with its result or `failed` with its JSON-RPC error. A task whose run a process claimed and never
ended (the process stopped) is `failed` with the outcome unknown once its deadline passes; a call runs at most once.
The asking call's own denied row says the request; the run's rows are a call's like any other."""

import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from gateway_project.lib.database import database_async
from handoff.mcp.agent_relay import AgentRelay
from handoff.mcp.caller import Caller, caller_of, legacy_agent
from handoff.mcp.pipeline.answer import agent_answer
from handoff.mcp.pipeline.call import Call
from handoff.mcp.pipeline.run import call_serve
from handoff.mcp.pipeline.sign_off import PENDING
from handoff.mcp.pipeline.task_state import CallTask, TaskCreated, owner_of
from handoff.models import ToolTask
from policy.models import SignOff
from policy.sign_off import sign_off_state

EXTENSION = "io.modelcontextprotocol/tasks"
Status = ToolTask.Status
UNKNOWN_OUTCOME = -32603  # JSON-RPC internal error: the call's outcome is not known


def extension_declared(ctx: ServerRequestContext) -> bool:
    """Whether a 2026-07-28 request declares the Tasks extension in its own capabilities."""
    if legacy_agent(ctx):
        return False
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and EXTENSION in (capabilities.extensions or {})


async def task_or_answer(call: Call) -> dict[str, Any]:
    """The call's answer, unless it was told to wait for a sign-off: then a task (TaskCreated), while fewer than
    GATEWAY_SIGN_OFF_TASKS_MAX tasks are live."""
    denial = call.denial
    if denial is not None and denial.code == PENDING and denial.sign_off and call.caller is not None:
        task = await database_async(_open)(call.caller, call.name, call.asked, denial.sign_off, denial.message)
        if task is not None:
            raise TaskCreated(task.id, {"resultType": "task", **_wire(task)})
    return await agent_answer(call)


def _open(caller: Caller, name: str, arguments: dict[str, Any], sign_off: str, message: str) -> ToolTask | None:
    now = timezone.now()
    ToolTask.objects.filter(expires_at__lte=now).delete()  # the bound counts live tasks only
    if ToolTask.objects.count() >= settings.GATEWAY_SIGN_OFF_TASKS_MAX:
        return None
    ttl = timedelta(seconds=settings.GATEWAY_SIGN_OFF_TASK_TTL_SECONDS)
    return ToolTask.objects.create(
        id=secrets.token_urlsafe(16),
        sign_off_id=sign_off,
        name=name,
        arguments=arguments,
        message=message,
        created_at=now,
        updated_at=now,
        expires_at=now + ttl,
        **_owner(caller),
    )


def _owner(caller: Caller) -> dict[str, Any]:
    """The caller as the sign-off binds them (policy.sign_off.Binding): the key only where no person called."""
    return {
        "agent_id": caller.agent_id,
        "key_prefix": "" if caller.person_subject else caller.key_prefix,
        "person_issuer": caller.person_issuer,
        "person_subject": caller.person_subject,
        "client_id": caller.client_id,
    }


def _wire(task: ToolTask) -> dict[str, Any]:
    """The task as the extension's `DetailedTask`."""
    wire: dict[str, Any] = {
        "taskId": task.id,
        "status": task.status,
        "createdAt": _iso(task.created_at),
        "lastUpdatedAt": _iso(task.updated_at),
        "ttlMs": round((task.expires_at - task.created_at).total_seconds() * 1000),
        "pollIntervalMs": settings.GATEWAY_SIGN_OFF_RETRY_SECONDS * 1000,
    }
    if task.message:
        wire["statusMessage"] = task.message
    if task.status == Status.COMPLETED:
        wire["result"] = task.outcome
    elif task.status == Status.FAILED:
        wire["error"] = task.outcome
    return wire


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _find(caller: Caller, task_id: str) -> ToolTask:
    """The caller's live task of that id; another caller's, or one expired, is unknown alike."""
    live = ToolTask.objects.filter(id=task_id, session_id="", expires_at__gt=timezone.now(), **_owner(caller))
    task = live.first()
    if task is None:
        raise MCPError(types.INVALID_PARAMS, f"Unknown task {task_id!r}: none of yours has this id, or it expired.")
    return task


def _end(task: ToolTask, status: str, message: str, outcome: dict[str, Any] | None) -> ToolTask:
    task.status, task.message, task.outcome, task.arguments = status, message[:1000], outcome, None
    task.updated_at = timezone.now()
    task.save(update_fields=["status", "message", "outcome", "arguments", "updated_at"])
    return task


def _standing(caller: Caller, task_id: str) -> tuple[ToolTask, bool]:
    """The task as it stands, ended where its request expired or a run was lost; and whether this poll runs the
    call now (it claimed the run: the request is decided)."""
    task = _find(caller, task_id)
    now = timezone.now()
    if task.status != Status.WORKING:
        return task, False
    if task.running_until is not None:
        if task.running_until <= now:
            message = (
                f"The gateway stopped while it ran the call of {task.name!r}: whether it ran is unknown. "
                "Its outcome is in the audit trail; do not repeat it unchecked."
            )
            _end(task, Status.FAILED, message, {"code": UNKNOWN_OUTCOME, "message": message})
        return task, False
    state = sign_off_state(str(task.sign_off_id))
    if state == SignOff.State.PENDING:
        return task, False
    if state in (SignOff.State.EXPIRED, SignOff.State.USED):
        message = (
            f"No one signed off this call of {task.name!r} in time: its request ({task.sign_off_id}) expired."
            if state == SignOff.State.EXPIRED
            else f"The sign-off of this call of {task.name!r} was used by another call of the same."
        )
        code = "SIGNOFF_EXPIRED" if state == SignOff.State.EXPIRED else "SIGNOFF_USED"
        _end(task, Status.FAILED, message, {"code": types.INVALID_REQUEST, "message": message, "data": {"code": code}})
        return task, False
    until = now + timedelta(seconds=settings.GATEWAY_MAX_TIMEOUT * 2)  # past any call's deadline
    claimed = ToolTask.objects.filter(id=task.id, status=Status.WORKING, running_until=None)
    if claimed.update(running_until=until, updated_at=now) != 1:  # another poll runs it
        return task, False
    task.refresh_from_db()
    return task, True


async def task_get(ctx: ServerRequestContext, task_id: str) -> dict[str, Any]:
    """`tasks/get`: the task; the poll that finds its request decided runs the call first (granted, it runs;
    refused, it is refused with the approver's reason) and answers it ended."""
    caller = caller_of(ctx)
    task, runs = await database_async(_standing)(caller, task_id)
    if runs:
        task = await _run(ctx, caller, task)
    return _wire(task)


async def _run(ctx: ServerRequestContext, caller: Caller, task: ToolTask) -> ToolTask:
    call = Call(task.name, task.arguments or {}, "", caller=caller, ctx=ctx, relay=AgentRelay(ctx))
    try:
        result = await call_serve(call, agent_answer)
    except MCPError as refused:
        error = refused.error.model_dump(mode="json", exclude_none=True)
        return await database_async(_end)(task, Status.FAILED, refused.error.message, error)
    return await database_async(_end)(task, Status.COMPLETED, "", result)


def _cancel(caller: Caller, task_id: str) -> None:
    task = _find(caller, task_id)
    waiting = ToolTask.objects.filter(id=task.id, status=Status.WORKING, running_until=None)
    waiting.update(
        status=Status.CANCELLED, message="Cancelled by its client.", arguments=None, updated_at=timezone.now()
    )


async def task_cancel(ctx: ServerRequestContext, task_id: str) -> dict[str, Any]:
    """`tasks/cancel`: a task still waiting for its sign-off ends `cancelled` (the request stays pending until it
    expires); one whose call runs or ran keeps its outcome (the extension lets cancelling be cooperative)."""
    await database_async(_cancel)(caller_of(ctx), task_id)
    return {}


async def task_update(ctx: ServerRequestContext, task_id: str) -> dict[str, Any]:
    """`tasks/update`: such a task never asks its client for input, so there is nothing to answer; acknowledged."""
    await database_async(_find)(caller_of(ctx), task_id)
    return {}


def legacy_open(task: CallTask, caller: Caller, name: str) -> None:
    """A 2025-11-25 task, written down for the session's other processes (the one that runs it keeps it too)."""
    ToolTask.objects.create(
        id=task.task_id,
        sign_off_id=task.sign_off,
        name=name,
        session_id=caller.session_id,
        message=task.message,
        created_at=task.created,
        updated_at=task.updated,
        expires_at=task.created + timedelta(milliseconds=task.ttl_ms),
        **_owner(caller),
    )


def legacy_end(task: CallTask) -> None:
    """Where a 2025-11-25 task ended, for the session's other processes; one ended already (cancelled) keeps it."""
    outcome = task.error.model_dump(mode="json", exclude_none=True) if task.error is not None else task.result
    row = ToolTask.objects.filter(id=task.task_id, status=Status.WORKING)
    row.update(status=task.status, message=task.message[:1000], outcome=outcome, updated_at=task.updated)


def legacy_find(caller: Caller, task_id: str) -> CallTask | None:
    """The caller's 2025-11-25 task that another process of the session runs, as its row says it stands."""
    found = ToolTask.objects.filter(
        id=task_id, session_id=caller.session_id, expires_at__gt=timezone.now(), **_owner(caller)
    ).first()
    if found is None or not caller.session_id:
        return None
    task = CallTask(
        found.id,
        owner_of(caller),
        round((found.expires_at - found.created_at).total_seconds() * 1000),
        created=found.created_at,
        updated=found.updated_at,
        status=found.status,
        message=found.message,
        result=found.outcome if found.status == Status.COMPLETED else None,
        error=types.ErrorData.model_validate(found.outcome) if found.status == Status.FAILED else None,
        here=False,
    )
    if task.ended:
        task.done.set()
    return task


def legacy_cancel(task: CallTask) -> None:
    waiting = ToolTask.objects.filter(id=task.task_id, status=Status.WORKING)
    waiting.update(status=Status.CANCELLED, message="Cancelled by its client.", updated_at=timezone.now())
