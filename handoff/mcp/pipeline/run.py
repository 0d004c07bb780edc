"""The runner: a call through its stages in order, each once. A stage that refuses ends the call with its denied
row; once approved, the call gets exactly one completion row, whatever happens after."""

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from audit.telemetry import log_fields_add, stage_span, stage_span_ended, stages_observe
from handoff.mcp.pipeline.call import AGENT, Call
from handoff.mcp.pipeline.execute import execute_stage, result_stage
from handoff.mcp.pipeline.extra import before_execute_stage
from handoff.mcp.pipeline.routing import admit_stage, caller_stage, decide_stage, route_stage
from handoff.mcp.pipeline.rows import admission_release, approval_row, completion_row, denial_row, refused_row
from handoff.mcp.pipeline.sign_off import sign_off_stage
from policy.decisions import ToolRefused

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
    for name, stage in BEFORE:
        await stage_run(call, name, stage)
        if call.denial:
            break
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
