"""The built-in result filter (handoff/result_filter.py): secrets in a tool's result are blanked before the model
reads them, and the completion row counts what was blanked, never what it was."""

import pytest

from handoff import result_filter
from handoff.stages import StageCall
from tests.handoff.mcp.test_tools import _called
from tests.helpers import audit_mark, audit_since

PRIVATE_KEY = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAn3fQ\nl0ngb0dy==\n-----END RSA PRIVATE KEY-----"


@pytest.mark.parametrize(
    ("text", "seen", "redacted"),
    [
        ("key AKIAIOSFODNN7EXAMPLE here", "key [redacted] here", {"aws_access_key": 1}),
        (f"the key:\n{PRIVATE_KEY}\ndone", "the key:\n[redacted]\ndone", {"private_key": 1}),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig", "Authorization: [redacted]", {"bearer_token": 1}),
    ],
)
def test_a_secret_in_a_result_is_blanked_for_the_model_and_counted_in_the_completion_row(caller, text, seen, redacted):
    mark = audit_mark()
    result = _called(caller, "layer__echo", {"text": text})
    assert result["content"] == [{"type": "text", "text": seen}]
    [completed] = [row for row in audit_since(mark) if row.kind == "completed"]
    assert completed.outcome == "ok"
    assert completed.detail["stages"] == {"result_filter": {"redacted": redacted}}
    assert text not in str(completed.detail)


def test_a_result_without_secrets_passes_unchanged_and_its_row_says_nothing_of_stages(caller):
    mark = audit_mark()
    assert _called(caller, "layer__echo", {"text": "nothing to hide"})["content"][0]["text"] == "nothing to hide"
    [completed] = [row for row in audit_since(mark) if row.kind == "completed"]
    assert "stages" not in completed.detail


def test_patterns_of_the_setting_are_blanked_too(caller, settings):
    settings.GATEWAY_RESULT_FILTER_PATTERNS = [r"sk_live_[0-9a-zA-Z]{8}"]
    result_filter.patterns.cache_clear()
    try:
        result = _called(caller, "layer__echo", {"text": "pay with sk_live_abcd1234"})
    finally:
        result_filter.patterns.cache_clear()
    assert result["content"][0]["text"] == "pay with [redacted]"


def test_a_result_without_secrets_is_given_back_itself_and_one_with_them_as_a_new_result():
    view = StageCall("id", "layer__echo", "layer", "echo", {}, "agent", "")
    clean = {"content": [{"type": "text", "text": "nothing to hide"}], "isError": False}
    assert result_filter.result_filter(view, clean) is clean  # so the stages' loop checks it no further
    secret = {"content": [{"type": "text", "text": "key AKIAIOSFODNN7EXAMPLE"}], "isError": False}
    assert result_filter.result_filter(view, secret) == {
        "content": [{"type": "text", "text": "key [redacted]"}],
        "isError": False,
    }
    assert secret["content"][0]["text"] == "key AKIAIOSFODNN7EXAMPLE"
    assert view.audit == {"redacted": {"aws_access_key": 1}}


def test_only_the_parts_of_a_result_that_hold_a_secret_are_copied_the_rest_are_shared_and_nothing_is_changed():
    view = StageCall("id", "layer__echo", "layer", "echo", {}, "agent", "")
    clean = {"type": "text", "text": "nothing to hide"}
    data = {"rows": [["plain", 1], ["Bearer abcdefgh12345678", None]], "note": ["plain"]}
    result = {"content": [clean, {"type": "text", "text": PRIVATE_KEY}], "structuredContent": data, "isError": False}
    filtered = result_filter.result_filter(view, result)
    assert filtered == {
        "content": [clean, {"type": "text", "text": "[redacted]"}],
        "structuredContent": {"rows": [["plain", 1], ["[redacted]", None]], "note": ["plain"]},
        "isError": False,
    }
    assert filtered["content"][0] is clean and filtered["structuredContent"]["note"] is data["note"]
    assert filtered["structuredContent"]["rows"][0] is data["rows"][0]
    assert result["content"][1]["text"] == PRIVATE_KEY and data["rows"][1][0] == "Bearer abcdefgh12345678"
    assert view.audit == {"redacted": {"bearer_token": 1, "private_key": 1}}
