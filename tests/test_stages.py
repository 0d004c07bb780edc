"""Stages an operator's app adds (handoff/stages.py), plugged into a gateway with GATEWAY_EXTRA_APPS: before
execute they see the arguments and may refuse; after execute they see and may change the result."""

import subprocess
import sys
from collections.abc import Iterator

import pytest
from mcp.shared.exceptions import MCPError

from tests import servers
from tests.clients import call
from tests.helpers import audit_mark, audit_since, run


@pytest.fixture(scope="module")
def staged(server_env, world, logs) -> Iterator[servers.Running]:
    apps = "examples.triage_app,tests.stage_app"
    with servers.inline_gateway_with(server_env, logs / "gateway-stages.log", GATEWAY_EXTRA_APPS=apps) as running:
        yield running


def _echo(gateway: servers.Running, key: str, text: str):
    return run(lambda: call(gateway.url, key, "demo__echo", {"text": text}))


def _gateway_error(gateway: servers.Running, key: str, text: str) -> list:
    """The rows of a call that ended with the gateway's own error."""
    mark = audit_mark()
    failed = _echo(gateway, key, text)
    assert isinstance(failed, MCPError)
    assert failed.error.data["code"] == "GATEWAY_ERROR"
    return audit_since(mark)


def test_a_stage_that_refuses_gives_the_agent_its_code_and_message_and_the_denied_row_names_it(staged, world):
    mark = audit_mark()
    refused = _echo(staged, world.key, "refuse: this")
    assert isinstance(refused, MCPError)
    assert refused.error.data["code"] == "NOT_THIS_TEXT"
    assert refused.error.message == "echo may not be called with 'refuse: this' here."
    [denied] = audit_since(mark)
    assert (denied.kind, denied.error_code, denied.error_detail) == ("denied", "NOT_THIS_TEXT", refused.error.message)
    assert denied.detail["stage"] == "test_refuser"
    assert _echo(staged, world.key, "served").content[0].text == "served"  # its admission went back


def test_a_stage_that_raises_before_execute_ends_the_call_with_the_gateways_error_and_the_next_is_served(staged, world):
    [denied] = _gateway_error(staged, world.key, "break before: now")
    assert (denied.kind, denied.error_code, denied.detail["stage"]) == ("denied", "GATEWAY_ERROR", "test_refuser")
    assert _echo(staged, world.key, "after the failure").content[0].text == "after the failure"


def test_a_stage_after_execute_changes_the_result_before_the_model_and_the_completion_row_says_so(staged, world):
    mark = audit_mark()
    result = _echo(staged, world.key, "shout: quietly")
    assert result.content[0].text == "SHOUT: QUIETLY"
    completed = [row for row in audit_since(mark) if row.kind == "completed"]
    assert [(row.outcome, row.detail["stages"]) for row in completed] == [("ok", {"test_shouter": {"changed": True}})]


def test_a_stage_that_returns_a_malformed_result_has_it_withheld_and_the_call_completed_as_a_gateway_error(
    staged, world
):
    [completed] = [row for row in _gateway_error(staged, world.key, "malformed: please") if row.kind == "completed"]
    assert (completed.outcome, completed.error_code) == ("error", "GATEWAY_ERROR")
    assert "stage 'test_shouter' returned no tool result" in completed.error_detail


def test_a_stage_that_makes_the_result_it_was_given_malformed_in_place_has_it_withheld_too(staged, world):
    [completed] = [
        row for row in _gateway_error(staged, world.key, "malformed in place: now") if row.kind == "completed"
    ]
    assert (completed.outcome, completed.error_code) == ("error", "GATEWAY_ERROR")
    assert "stage 'test_shouter' returned no tool result" in completed.error_detail


def _checked(server_env: dict[str, str], **env: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "manage.py", "check"]
    return subprocess.run(command, env=server_env | env, capture_output=True, text=True, timeout=120)


def test_a_misnamed_app_in_the_setting_stops_start_up_naming_it(server_env):
    checked = _checked(server_env, GATEWAY_EXTRA_APPS="tests.no_such_stage_app")
    assert checked.returncode != 0
    assert "tests.no_such_stage_app" in checked.stderr


def test_a_result_filter_pattern_that_is_no_regular_expression_stops_start_up_naming_it(server_env):
    checked = _checked(server_env, GATEWAY_RESULT_FILTER_PATTERNS='["sk_[a-z"]')
    assert checked.returncode != 0
    assert "GATEWAY_RESULT_FILTER_PATTERNS: 'sk_[a-z' is not a regular expression" in checked.stderr
