"""The runner: a call through its stages in order, each once (those before the upstream's twice where the
session's state changed under a call that ran on it unread). A stage that refuses ends the call with its denied
row; once approved, the call gets exactly one completion row, whatever happens after."""

import logging
import time
from collections.abc import Awaitable, Callable
from operator import attrgetter
from typing import TypeVar

from audit.telemetry import log_fields_add, stage_span, stage_span_ended, stages_observe
from handoff.mcp.pipeline.call import AGENT, Call
from handoff.mcp.pipeline.execute import execute_stage, result_stage
from handoff.mcp.pipeline.extra import before_execute_stage
from handoff.mcp.pipeline.routing import (
    StateChanged,
    admit_stage,
    caller_stage,
    decide_stage,
    route_stage,
    state_unavailable,
)
from handoff.mcp.pipeline.rows import admission_release, approval_row, completion_row, denial_row, refused_row
from handoff.mcp.pipeline.sign_off import sign_off_stage
from handoff.mcp.unverified import unverified_take
from handoff.protocol.tunnels import SessionStateUnavailable
from policy.decisions import ToolRefused

logger = logging.getLogger(__name__)
T = TypeVar("T")
Stage = Callable[[Call], Awaitable[None]]
BEFORE: tuple[tuple[str, Stage], ...] = (
    ("caller", caller_stage),
    ("route", route_stage),
    ("decide", decide_stage),
    ("sign_off", sign_off_stage),
    ("admit", admit_stage),
    ("before_execute", before_execute_stage),
)
# A call's fields, to be set back as its frame made them when its stages run again; but for what the first run's
# stages leave that the second must keep: their timers, and the unverified state, which is read by then.
_fields = attrgetter(*Call.__slots__)
_KEPT = frozenset({"timers", "unverified"})


async def stage_run(call: Call, name: str, stage: Stage) -> None:
    call.stage, started = name, time.perf_counter()
    try:
        with stage_span(name, call.traced):
            await stage(call)
    finally:
        call.timers[name] = time.perf_counter() - started


async def call_serve(call: Call, answer: Callable[[Call], Awaitable[T]]) -> T:
    """The call through every stage, then its answer in the form its origin takes. The frame stage (the request
    object made, a 2026-07-28 round sorted out) ran from the call's making to here."""
    call.timers["frame"] = time.perf_counter() - call.started
    if call.traced:
        stage_span_ended("frame", call.timers["frame"])
    try:
        await call_run(call)
        started = time.perf_counter()
        try:
            with stage_span("answer", call.traced):
                return await answer(call)
        finally:
            call.timers["answer"] = time.perf_counter() - started
    finally:
        stages_observe(call.timers)


async def call_run(call: Call) -> None:
    """Leaves the call refused (`call.denial`) or completed (`call.outcome`, `call.result`) for its answer."""
    await _before(call)
    if call.origin == AGENT:
        log_fields_add(request_id=str(call.request_id), upstream=call.upstream)
    if call.denial:
        await admission_release(call, "none")  # a stage after admit refused
        await stage_run(call, "denial_row", denial_row)
        return
    await stage_run(call, "approval_row", approval_row)
    try:
        await stage_run(call, "execute", execute_stage)
    except ToolRefused as refused:  # a gateway tool's, once approved: its completion row says so
        await refused_row(call, refused.denial)
        await admission_release(call, "none")
        call.denial = refused.denial
        return
    except BaseException:
        await admission_release(call, "none")
        raise
    await stage_run(call, "result", result_stage)
    await stage_run(call, "completion_row", completion_row)


async def _before(call: Call) -> None:
    """The stages up to the upstream's. On session state this process did not read for the call, they run as
    if it had, unless it changed meanwhile: then again, on the state as it is now (handoff/mcp/unverified.py)."""
    call.unverified = unverified_take() if call.origin == AGENT else None
    if call.unverified is None:
        return await _stages(call)
    first = _fields(call)
    try:
        try:
            await _stages(call)
            changed = False
        except StateChanged:
            changed = True
        if call.unverified is not None:  # not admitted (refused, or a handoff move): nothing checked it yet
            changed = await call.unverified.reread() or changed
    except SessionStateUnavailable as unavailable:
        logger.error("session state unavailable: %s", unavailable)
        call.denial = state_unavailable(call.name)
        return
    finally:
        call.unverified = None
    if changed:
        for name, value in zip(Call.__slots__, first, strict=True):
            if name not in _KEPT:
                setattr(call, name, value)
        await _stages(call)


async def _stages(call: Call) -> None:
    for name, stage in BEFORE:
        if name == "sign_off" and call.sign_off and (unverified := call.unverified) is not None:
            call.unverified = None  # a person is not asked about a call on a session that ended or changed
            if await unverified.reread():
                raise StateChanged
        await stage_run(call, name, stage)
        if call.denial:
            break
