"""Code mode as the rest of the gateway reaches it. Its modules import Deno's package and NumPy, which the image's
default target leaves out (gateway_project/lib/code_mode.py), so they are imported here, only where code mode runs:
without them the gateway serves everything else."""

from typing import Any

from django.conf import settings

from gateway_project.lib.code_mode import NOT_INSTALLED, code_mode_missing, not_installed_message
from handoff.mcp.pipeline.call import OwnRun
from registry.upstreams.outcome import Outcome, failure


def own_tools() -> dict[str, OwnRun]:
    """Code mode's tools as the pipeline runs them; none while it is off (its tools are not offered then)."""
    if settings.GATEWAY_CODE_MODE == "off":
        return {}
    from handoff.codemode.run import OWN_TOOLS  # optional: imports Deno's package and NumPy

    return OWN_TOOLS


async def execution_run(execution: dict[str, Any]) -> Outcome:
    """An execution a web process sent to this worker (queue `sandbox`): refused, saying why, where this worker's
    image has no code mode (a web process of the full image beside workers of the default one)."""
    if missing := code_mode_missing():
        message = "Code mode is not installed on the gateway's worker that took this code; it did not run."
        return failure(NOT_INSTALLED, message, not_installed_message(missing))
    from handoff.codemode.run import execution_run as run  # optional: imports Deno's package and NumPy

    return await run(execution)
