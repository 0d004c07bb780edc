"""The sandbox as a process that runs many executions: what one leaves behind in the interpreter."""

import sys
from typing import Any

import anyio

from handoff.codemode.bindings import Binding, bindings_build
from handoff.codemode.sandbox import SandboxLimits, sandbox_run

LIMITS = SandboxLimits(timeout=30.0, heap_mb=128, max_calls=10, max_output_bytes=65_536)


async def no_tool(binding: Binding, args: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError("the code calls no tool")


async def six_times_seven() -> Any:
    return (await sandbox_run(code="return 6 * 7;", bindings=bindings_build([]), call=no_tool, limits=LIMITS)).value


def test_executions_intern_no_string_of_their_own(monkeypatch):
    """Each execution has a folder with a new name; given to pathlib, that name went into CPython's table of interned
    strings (pathlib interns a path's parts with sys.intern), one more entry each run, until the table doubled in a
    worker (docs/reliability.md). What runs after the first intern must be what the first did."""
    interned: list[str] = []
    real = sys.intern

    def recording(text: str) -> str:
        interned.append(text)
        return real(text)

    monkeypatch.setattr(sys, "intern", recording)
    each_run = []
    for _ in range(4):
        interned.clear()
        assert anyio.run(six_times_seven) == 42
        each_run.append(set(interned))
    first, *later = each_run
    assert [run - first for run in later] == [set(), set(), set()]
