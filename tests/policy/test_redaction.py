"""Error redaction: the audit keeps an upstream's error whole; the model gets the tool name and the message
without URLs, addresses and ports, paths, tokens, keys, stack traces or `Caused by:` chains. Input-validation
messages pass intact, so the model can fix its call."""

import pytest

from policy.redaction import redact, redact_error_result
from tests.clients import call
from tests.helpers import audit_mark, audit_since, run

# What the demo's `leak` tool says (examples/demo_upstream.py), and every piece that must not reach the model.
SECRETS = [
    "api.internal.example.com",
    "8443",
    "10.20.30.40",
    "5432",
    "fd00::17",
    "/etc/demo/secrets.json",
    "eyJhbGciOiJIUzI1NiJ9",
    "sk-live-0123456789abcdefghij",
    "Traceback",
    "/srv/demo/app.py",
    "Caused by",
    "db.internal",
]
REDACTED = (
    "upstream failed: POST [url] failed from [address] and [address], config [path], header Authorization: "
    "[redacted] [redacted], api_key=[redacted]\nConnectionError: refused"
)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("fetch https://user:pw@host.example/x?token=1 failed", "fetch [url] failed"),
        ("no route to 192.168.1.20:8080", "no route to [address]"),
        ("no route to [2001:db8::1]:443 or ::1", "no route to [address] or [address]"),
        ("cannot reach cache.internal:6379", "cannot reach [address]"),
        ("cannot read /var/lib/app/key.pem or C:\\Users\\me\\.aws\\credentials", "cannot read [path] or [path]"),
        ("sent Bearer abc.def-ghi_jkl123", "sent Bearer [redacted]"),
        ("password=hunter2 token: 'abc'", "password=[redacted] token: [redacted]"),
        ("key ghp_0123456789abcdefghijABCDEFGHIJ0123 revoked", "key [redacted] revoked"),
        ("AWS key AKIAABCDEFGHIJKLMNOP denied", "AWS key [redacted] denied"),
        ("id 0f8fad5bd9cb469fa16570867728950e0f8fad5b rejected", "id [redacted] rejected"),
        ("Traceback (most recent call last):\n  File \"/a/b.py\", line 1, in f\nKeyError: 'x'", "KeyError: 'x'"),
        ("Error: boom\n    at run (/srv/app/index.js:10:5)\n    at node:internal/x:1:2", "Error: boom"),
        ("lookup failed. Caused by: DNS error for db.corp", "lookup failed."),
        (
            "City 'Atlantis' not found; try one of: Paris, Berlin",
            "City 'Atlantis' not found; try one of: Paris, Berlin",
        ),
    ],
    ids=lambda value: value[:24],
)
def test_each_secret_class_is_removed_and_plain_words_stay(message, expected):
    assert redact(message) == expected


def test_a_tools_own_error_result_reaches_the_model_redacted_and_the_audit_whole(gateway, world):
    mark = audit_mark()
    result = run(lambda: call(gateway.url, world.key, "demo__leak", {"how": "result"}))
    assert result.is_error and result.content[0].text == REDACTED
    [completed] = [r for r in audit_since(mark) if r.kind == "completed"]
    assert completed.error_code == "TOOL_ERROR"
    assert all(secret in completed.error_detail for secret in SECRETS)


def test_an_upstreams_json_rpc_error_reaches_the_model_redacted_with_the_tool_name(inline_gateway, world):
    mark = audit_mark()
    result = run(lambda: call(inline_gateway.url, world.key, "demo__leak", {"how": "error"}))
    text = result.content[0].text
    assert text == f"demo__leak: The service refused the request: {REDACTED}"
    assert not [secret for secret in SECRETS if secret in text]
    [completed] = [r for r in audit_since(mark) if r.kind == "completed"]
    assert completed.error_code == "UPSTREAM_ERROR" and "10.20.30.40:5432" in completed.error_detail


def test_an_input_validation_message_passes_intact(inline_gateway, world):
    result = run(lambda: call(inline_gateway.url, world.key, "demo__leak", {"how": "validation"}))
    assert result.content[0].text == (
        "demo__leak: The service refused the request: Input validation error: 'path' must be like "
        "/srv/data/x.json and 'host' like 10.0.0.1, got 'x'"
    )


def test_structured_content_of_an_error_result_is_redacted_too():
    result = {
        "content": [{"type": "text", "text": "failed at 10.1.2.3:80"}, {"type": "image", "data": "AAAA"}],
        "structuredContent": {"error": {"url": "https://internal.example/x", "codes": [1, "see /var/log/app.log"]}},
        "isError": True,
    }
    assert redact_error_result(result) == {
        "content": [{"type": "text", "text": "failed at [address]"}, {"type": "image", "data": "AAAA"}],
        "structuredContent": {"error": {"url": "[url]", "codes": [1, "see [path]"]}},
        "isError": True,
    }
