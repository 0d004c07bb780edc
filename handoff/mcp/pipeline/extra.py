"""The stages an operator's apps add (handoff/stages.py), at their two points in the call: before execute, once
the call is decided and admitted (a refusal is a denial that names the stage), and after execute, on the result
before the completion row and the model (a result that is no tool result any more is withheld). The gateway's
own tools run none: they reach no upstream."""

import json
import logging
from types import MappingProxyType
from typing import Any

from mcp import types
from pydantic import ValidationError

from handoff.mcp.pipeline.call import Call
from handoff.stages import AFTER, BEFORE, StageCall, StageRefusal, stages
from policy.decisions import Denial

logger = logging.getLogger(__name__)

STAGE_FAILED = "The gateway failed before running this call, so it was not run. Try again later."


class MalformedResult(Exception):
    """An after-execute stage returned what is no tool result."""


def _view(call: Call) -> StageCall:
    assert call.caller is not None
    return StageCall(
        request_id=str(call.request_id),
        name=call.name,
        upstream=call.upstream,
        tool=call.tool,
        arguments=MappingProxyType(call.arguments),
        agent_name=call.caller.agent_name,
        person_subject=call.caller.person_subject,
    )


async def before_execute_stage(call: Call) -> None:
    chain = stages(BEFORE)
    if call.own or not chain:
        return
    view = _view(call)
    for stage in chain:
        try:
            await stage(view)
        except StageRefusal as refusal:
            call.denial, call.extra_stage = Denial(refusal.code, refusal.message), stage.name
            return
        except Exception:
            logger.exception("stage %s failed on request %s", stage.name, call.request_id)
            call.denial = Denial("GATEWAY_ERROR", STAGE_FAILED, types.INTERNAL_ERROR)
            call.extra_stage = stage.name
            return


async def after_execute_stages(call: Call) -> None:
    """Raises MalformedResult (or whatever a stage raised): the result stage withholds the result then."""
    chain = stages(AFTER)
    if call.own or not chain:
        return
    assert call.result is not None
    for stage in chain:
        view = _view(call)
        result = await stage(view, call.result)
        given = result is call.result
        if not (given and stage.own):
            _check(stage.name, result)
        if not given and result != call.result and not view.audit:
            view.audit["changed"] = True
        if view.audit:
            call.stage_audit[stage.name] = view.audit
        call.result = result


def _check(name: str, result: Any) -> None:
    try:
        types.CallToolResult.model_validate(result)
        json.dumps(result)
    except (ValidationError, TypeError, ValueError) as exc:
        raise MalformedResult(f"stage {name!r} returned no tool result: {exc}") from None
    if not isinstance(result, dict):
        raise MalformedResult(f"stage {name!r} returned no tool result: {type(result).__name__}")
