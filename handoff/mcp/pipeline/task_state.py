"""The tasks of calls made as tasks (as_task.py), as the process that runs them holds them: bounded in number
(GATEWAY_SIGN_OFF_TASKS_MAX), each bound to its caller and kept for its ttl (at most
GATEWAY_SIGN_OFF_TASK_TTL_SECONDS). Each is written down as a row too (tool_task.py), for the session's other
processes."""

import asyncio
import logging
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from mcp import types

from handoff.mcp.caller import Caller

logger = logging.getLogger(__name__)
WORKING, COMPLETED, FAILED, CANCELLED = "working", "completed", "failed", "cancelled"
RELATED_TASK = "io.modelcontextprotocol/related-task"  # the _meta key naming a result's task


@dataclass(eq=False)
class CallTask:
    """One task: whose it is (agent, person, session), where it stands, and its outcome once it ends."""

    task_id: str
    owner: tuple[int, str, str, str]
    ttl_ms: int
    created: datetime = field(default_factory=timezone.now)
    updated: datetime = field(default_factory=timezone.now)
    status: str = WORKING
    message: str = ""
    result: dict[str, Any] | None = None
    error: types.ErrorData | None = None
    asked: asyncio.Event = field(default_factory=asyncio.Event)  # set once the call waits for a sign-off
    done: asyncio.Event = field(default_factory=asyncio.Event)
    written: asyncio.Event = field(default_factory=asyncio.Event)  # its row made: where it ends may be written
    wake: asyncio.Event | None = None  # the sign-off wait's, while the call waits: cancelling wakes it
    runner: asyncio.Task | None = None
    sign_off: str = ""  # the request the call waits for
    here: bool = True  # this process runs it (else: a copy of its row, which another process keeps up to date)

    @property
    def ended(self) -> bool:
        return self.status in (COMPLETED, FAILED, CANCELLED)

    def waits(self, message: str, wake: asyncio.Event, sign_off: str) -> None:
        """The call waits for a sign-off: the task is answered now, `working`."""
        self.message, self.wake, self.updated, self.sign_off = message, wake, timezone.now(), sign_off
        self.asked.set()

    def end(self, status: str, message: str, result: dict[str, Any] | None = None, error: Any = None) -> None:
        """The task's last state; a task that has ended already (cancelled) keeps its own."""
        if self.ended:
            return
        self.status, self.message, self.result, self.error = status, message, result, error
        self.updated, self.wake = timezone.now(), None
        self.done.set()

    def cancel(self, message: str = "Cancelled by its client.") -> None:
        wake = self.wake
        self.end(CANCELLED, message)
        if wake is not None:
            wake.set()

    def wire(self) -> dict[str, Any]:
        """The task as 2025-11-25's `Task`."""
        task = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": self.created.isoformat(),
            "lastUpdatedAt": self.updated.isoformat(),
            "ttl": self.ttl_ms,
            "pollInterval": settings.GATEWAY_SIGN_OFF_RETRY_SECONDS * 1000,
        }
        return task | ({"statusMessage": self.message} if self.message else {})

    def expired(self, now: datetime) -> bool:
        return self.ended and now - self.created > timedelta(milliseconds=self.ttl_ms)


class TaskCreated(Exception):
    """The call became a task: its request is answered with this CreateTaskResult, either era's (handoff/mcp/
    task_calls.py turns it into the answer, past the SDK's check that a tools/call answers a CallToolResult)."""

    def __init__(self, task_id: str, result: dict[str, Any]) -> None:
        super().__init__(task_id)
        self.result = result


class TaskCancelled(Exception):
    """The task was cancelled while its call waited for a sign-off: the call ends there, with no row (as a 2025-11-25
    call whose client cancels its wait); the sign-off request stays pending."""


_tasks: dict[str, CallTask] = {}  # this process's, by id


def owner_of(caller: Caller) -> tuple[int, str, str, str]:
    return (caller.agent_id, caller.person_issuer, caller.person_subject, caller.session_id)


def task_open(caller: Caller, ttl_ms: int | None) -> CallTask | None:
    """A new task for the caller, or None when this process holds as many as it may."""
    now = timezone.now()
    for ident in [ident for ident, task in _tasks.items() if task.expired(now)]:
        del _tasks[ident]
    if len(_tasks) >= settings.GATEWAY_SIGN_OFF_TASKS_MAX:
        logger.warning("%s tasks held: a call asking for one is served without", len(_tasks))
        return None
    longest = settings.GATEWAY_SIGN_OFF_TASK_TTL_SECONDS * 1000
    task = CallTask(secrets.token_urlsafe(16), owner_of(caller), min(ttl_ms or longest, longest))
    _tasks[task.task_id] = task
    return task


def task_find(caller: Caller, task_id: str) -> CallTask | None:
    """The caller's task of that id held here; another caller's, or one gone, is none."""
    task = _tasks.get(task_id)
    if task is None or task.owner != owner_of(caller) or task.expired(timezone.now()):
        return None
    return task


def task_held(task_id: str) -> CallTask | None:
    """The task of that id this process runs, whoever asks (a cancellation relayed from another process)."""
    return _tasks.get(task_id)


def forget(task: CallTask) -> None:
    _tasks.pop(task.task_id, None)


def tasks_forget(session_id: str) -> None:
    """The session ended, or this process no longer holds it: its tasks end (a call waiting for its sign-off stops
    waiting, the request left pending) and are dropped."""
    for task in [task for task in _tasks.values() if session_id and task.owner[3] == session_id]:
        task.cancel("Cancelled: its session ended.")
        forget(task)
