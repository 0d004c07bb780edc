"""A tools/call's stages, each run once and in order (handoff/mcp/pipeline/), called in this process."""

import anyio
import pytest
from mcp import types
from mcp.shared.exceptions import MCPError
from prometheus_client import REGISTRY

from handoff.mcp.pipeline import run
from handoff.mcp.tools import call_tool
from tests.handoff.mcp.test_tools import _ctx
from tests.helpers import snapshot_current

RAN = [
    "caller",
    "route",
    "decide",
    "sign_off",
    "admit",
    "before_execute",
    "approval_row",
    "execute",
    "result",
    "completion_row",
    "answer",
]


@pytest.fixture
def stages_run(monkeypatch) -> list[str]:
    ran: list[str] = []
    stage_run, call_serve = run.stage_run, run.call_serve

    async def recorded(call, name, stage):
        ran.append(name)
        await stage_run(call, name, stage)

    async def answered(call, answer):
        try:
            return await call_serve(call, answer)
        finally:
            ran.append("answer")

    monkeypatch.setattr(run, "stage_run", recorded)
    monkeypatch.setattr("handoff.mcp.pipeline.frame.call_serve", answered)
    return ran


def _called(caller, name: str, arguments: dict) -> dict:
    async def calling() -> dict:
        await snapshot_current()
        return await call_tool(_ctx(caller), types.CallToolRequestParams(name=name, arguments=arguments))

    return anyio.run(calling)


def test_a_direct_call_runs_every_stage_once_in_order(caller, stages_run):
    _called(caller, "layer__echo", {"text": "staged"})
    assert stages_run == RAN


def test_a_denied_call_stops_at_the_stage_that_refused_it_and_writes_its_denied_row(caller, stages_run):
    with pytest.raises(MCPError):
        _called(caller, "layer__nonexistent", {})
    assert stages_run == ["caller", "route", "decide", "denial_row", "answer"]


def test_each_stage_of_a_call_is_timed_into_its_histogram(caller):
    timed = ["frame", *RAN]  # the frame's time runs from the call's making to its first stage

    def counts() -> dict[str, float]:
        return {stage: REGISTRY.get_sample_value("switchboard_call_stage_seconds_count", {"stage": stage}) or 0.0
                for stage in timed}  # fmt: skip

    before = counts()
    _called(caller, "layer__echo", {"text": "timed"})
    after = counts()
    assert {stage: after[stage] - before[stage] for stage in timed} == dict.fromkeys(timed, 1.0)
