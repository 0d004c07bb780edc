"""Code mode as the rest of the gateway reaches it. Its modules import Deno's package and NumPy, which the image's
default target leaves out (gateway_project/lib/code_mode.py), so they are imported here, only where code mode runs:
without them the gateway serves everything else."""

from collections.abc import Iterator, Mapping
from typing import Any

from django.conf import settings

from gateway_project.lib.code_mode import NOT_INSTALLED, code_mode_missing, not_installed_message
from handoff.codemode.tools import EXECUTE, SEARCH_TOOLS
from handoff.mcp.pipeline.call import OwnRun
from registry.upstreams.outcome import Outcome, failure


class _CodeModeTools(Mapping[str, OwnRun]):
    """Code mode's tools by name, their module imported when one is run: every call asks whether its tool is one,
    and the first would otherwise wait for NumPy and the rest of code mode (0.1 s of a start) to call any tool."""

    _names = (SEARCH_TOOLS, EXECUTE)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __getitem__(self, name: str) -> OwnRun:
        if name not in self._names:
            raise KeyError(name)
        from handoff.codemode.run import OWN_TOOLS  # optional: imports Deno's package and NumPy

        return OWN_TOOLS[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def own_tools() -> Mapping[str, OwnRun]:
    """Code mode's tools as the pipeline runs them; none while it is off (its tools are not offered then)."""
    return {} if settings.GATEWAY_CODE_MODE == "off" else _CodeModeTools()


async def execution_run(execution: dict[str, Any]) -> Outcome:
    """An execution a web process sent to this worker (queue `sandbox`): refused, saying why, where this worker's
    image has no code mode (a web process of the full image beside workers of the default one)."""
    if missing := code_mode_missing():
        message = "Code mode is not installed on the gateway's worker that took this code; it did not run."
        return failure(NOT_INSTALLED, message, not_installed_message(missing))
    from handoff.codemode.run import execution_run as run  # optional: imports Deno's package and NumPy

    return await run(execution)
