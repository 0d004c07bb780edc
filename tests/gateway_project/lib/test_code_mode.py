"""Code mode where its parts are not installed (the image's default target): the settings turn it off and every
process says so, a process told to turn it on stops naming what is missing, and a worker handed an execution refuses
it. Hidden here as an image leaves them out: `sys.modules[name] = None` makes both import and find_spec miss them."""

import asyncio
import json
import sys

import pytest

from gateway_project.lib.code_mode import NOT_INSTALLED, code_mode_missing
from handoff.codemode.optional import execution_run, own_tools
from tests.test_settings import python

HIDE = "import sys; sys.modules['deno'] = sys.modules['numpy'] = None; "
SAID = (
    "code mode is not installed here (deno and numpy missing): search_tools and execute are not offered "
    "(GATEWAY_CODE_MODE=off)"
)
HINT = "docs/deploy.md, 'The image': its `full` target has code mode."


def test_code_mode_is_off_where_it_is_not_installed_and_manage_py_check_says_so(tmp_path):
    script = HIDE + "import django; django.setup(); from django.conf import settings; print(settings.GATEWAY_CODE_MODE)"
    assert python(tmp_path, ["-c", script], {}).stdout == "off\n"
    check = HIDE + "from django.core import management; management.execute_from_command_line(['', 'check'])"
    checked = python(tmp_path, ["-c", check], {})
    assert checked.returncode == 0
    assert checked.stderr == (
        f"System check identified some issues:\n\nINFOS:\n?: (switchboard.I001) {SAID}\n\tHINT: {HINT}\n\n"
        "System check identified 1 issue (0 silenced).\n"
    )


def test_the_web_process_logs_that_code_mode_is_not_installed_as_it_starts(tmp_path):
    started = python(tmp_path, ["-c", HIDE + "import gateway_project.asgi"], {"GATEWAY_LOG_FORMAT": "json"})
    assert started.returncode == 0, started.stderr
    logged = [json.loads(line) for line in started.stderr.splitlines()]
    assert [(line["level"], line["message"]) for line in logged] == [("INFO", f"{SAID} (switchboard.I001; {HINT})")]


@pytest.mark.parametrize("mode", ["on", "only"])
def test_code_mode_turned_on_where_it_is_not_installed_stops_the_process_naming_what_is_missing(tmp_path, mode):
    started = python(tmp_path, ["-c", HIDE + "import django; django.setup()"], {"GATEWAY_CODE_MODE": mode})
    assert started.returncode == 1
    assert started.stderr.strip().splitlines()[-1] == (
        f"django.core.exceptions.ImproperlyConfigured: GATEWAY_CODE_MODE is '{mode}', but code mode is not installed "
        "here (deno and numpy missing): run the image's `full` target (docs/deploy.md), or set GATEWAY_CODE_MODE to "
        "'off'"
    )


def test_a_worker_without_deno_refuses_an_execution_saying_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "deno", None)
    assert code_mode_missing() == ["deno"]
    outcome = asyncio.run(execution_run({"caller": {}, "request_id": "r", "trace_id": "t", "code": "return 1"}))
    assert outcome == {
        "ok": False,
        "code": NOT_INSTALLED,
        "message": "Code mode is not installed on the gateway's worker that took this code; it did not run.",
        "detail": "code mode is not installed here (deno missing)",
    }


def test_code_mode_off_runs_none_of_its_tools(settings):
    settings.GATEWAY_CODE_MODE = "off"
    assert own_tools() == {}
    settings.GATEWAY_CODE_MODE = "on"
    assert sorted(own_tools()) == ["execute", "search_tools"]


def test_code_modes_tools_are_its_runs_and_no_other_tool_is_one(settings):
    """own_tools() names code mode's tools without importing their module, and gives each one's run from it."""
    from handoff.codemode.run import OWN_TOOLS

    settings.GATEWAY_CODE_MODE = "on"
    tools = own_tools()
    assert [tools[name] for name in ("execute", "search_tools")] == [OWN_TOOLS["execute"], OWN_TOOLS["search_tools"]]
    assert "demo__echo" not in tools and len(tools) == 2
    with pytest.raises(KeyError, match="demo__echo"):
        tools["demo__echo"]
