"""The console's "Test this tool": a form made from the tool's schema (untrusted: escaped and bounded), a
confirmation, then the call through an agent's path (decided, admitted, audited with the operator as the
actor) in both executors; held tools refused. Also the tools list's descriptions, the pretty-printed
definition, and the audit list keeping agent and actor apart."""

import json
import uuid
from collections.abc import Iterator

import pytest

from audit.models import AuditEvent
from audit.services import audit_record
from handoff.console import CONSOLE_AGENT
from policy.models import Agent
from registry.models import Tool, Upstream
from tests.factories import demo_upstream
from tests.helpers import audit_mark, audit_since

HOSTILE = "<script>alert(1)</script>"


@pytest.fixture
def demo(db) -> Iterator[Upstream]:
    with demo_upstream("console-demo") as upstream:
        yield upstream
    Agent.objects.filter(name=CONSOLE_AGENT).delete()


def _tool(upstream: Upstream, name: str) -> Tool:
    return Tool.objects.get(upstream=upstream, name=name)


def _page(response) -> str:
    return response.content.decode()


def test_a_tool_page_offers_a_form_from_its_schema_and_asks_before_running(admin_client, demo):
    add = _tool(demo, "add")
    assert 'id="test-tool"' in _page(admin_client.get(f"/admin/registry/tool/{add.pk}/change/"))
    form = _page(admin_client.get(f"/admin/registry/tool/{add.pk}/test/"))
    assert 'name="arg0"' in form and 'name="arg1"' in form and "console-demo__add" in form
    mark = audit_mark()
    confirm = admin_client.post(f"/admin/registry/tool/{add.pk}/test/", {"arg0": "2", "arg1": "3.5"})
    assert confirm.status_code == 200
    page = _page(confirm)
    assert 'id="side-effects"' in page and "may\n      change data" in page
    assert json.loads(confirm.context["arguments"]) == {"a": 2.0, "b": 3.5}
    assert audit_since(mark) == [], "nothing runs before the operator confirms"
    wrong = admin_client.post(f"/admin/registry/tool/{add.pk}/test/", {"arg0": "two", "arg1": "1"})
    assert wrong.status_code == 400 and "Enter a number." in _page(wrong)


def test_a_tool_run_from_the_console_is_decided_admitted_and_audited_with_the_operator_as_actor(
    admin_client, demo, admin_executor
):
    echo = _tool(demo, "echo")
    mark = audit_mark()
    arguments = json.dumps({"text": f"hello {HOSTILE}"})
    ran = admin_client.post(f"/admin/registry/tool/{echo.pk}/test/", {"arguments": arguments, "confirmed": "Run it"})
    assert ran.status_code == 200
    page = _page(ran)
    assert "The tool answered." in page and HOSTILE not in page
    assert "hello &lt;script&gt;alert(1)&lt;/script&gt;" in page
    result = ran.context["call"].result
    assert (result["content"], result.get("isError")) == ([{"type": "text", "text": f"hello {HOSTILE}"}], False)
    # Its own rows: the outcome sweep may settle another test's leftover call meanwhile.
    rows = [r for r in audit_since(mark) if str(r.request_id) == ran.context["call"].request_id]
    assert [(r.kind, r.outcome) for r in rows] == [("approved", ""), ("completed", "ok")]
    for row in rows:
        assert (row.agent_name, row.actor, row.transport) == (CONSOLE_AGENT, "operator", "console")
        assert (row.upstream, row.tool, row.exposed_name) == ("console-demo", "echo", "console-demo__echo")
    [made] = [r for r in audit_since(mark) if r.kind == AuditEvent.Kind.ADMIN_CHANGE]
    assert (made.actor, made.agent_name, made.detail["action"]) == ("operator", CONSOLE_AGENT, "agent_created")


def test_the_console_agent_is_labelled_built_in_and_explained_wherever_an_operator_meets_it(admin_client, demo):
    """It stays pickable (a rule must name it under a deny-all stance), but never passes for an agent someone
    made and forgot."""
    echo = _tool(demo, "echo")
    form = _page(admin_client.get(f"/admin/registry/tool/{echo.pk}/test/"))
    assert 'id="tool-test-agent"' in form and "as the built-in agent <code>console</code>" in form
    admin_client.post(f"/admin/registry/tool/{echo.pk}/test/", {"arguments": "{}", "confirmed": "Run it"})
    console = Agent.objects.get(name=CONSOLE_AGENT)
    plain = Agent.objects.create(name="plain-agent")
    plain_pk = plain.pk
    try:
        pickers = [_page(admin_client.get(url)) for url in ("/admin/policy/rule/add/", "/admin/policy/agentgroup/add/")]
        listed = _page(admin_client.get("/admin/policy/agent/"))
        page = _page(admin_client.get(f"/admin/policy/agent/{console.pk}/change/"))
    finally:
        plain.delete()
    for picker in pickers:
        assert f'<option value="{console.pk}">console (built in: the console&#x27;s Test this tool)</option>' in picker
        assert f'<option value="{plain_pk}">plain-agent</option>' in picker
    explained = "Built in. Operators&#x27; calls from a tool&#x27;s Test this tool page run as this agent"
    assert explained in listed and explained in page
    assert "It holds no key; rules, limits and its switch apply to it as to any agent." in page


def test_the_console_agent_is_decided_like_any_other(admin_client, demo):
    """Excluded from nothing: switched off, the console's calls are refused, and the refusal is audited."""
    echo = _tool(demo, "echo")
    Agent.objects.create(name=CONSOLE_AGENT, enabled=False)
    mark = audit_mark()
    ran = admin_client.post(f"/admin/registry/tool/{echo.pk}/test/", {"arguments": "{}", "confirmed": "Run it"})
    assert ran.status_code == 200
    assert ran.context["call"].code == "AGENT_DISABLED"
    assert 'id="tool-test-refusal"' in _page(ran)
    [row] = audit_since(mark)
    assert (row.kind, row.error_code, row.actor, row.agent_name) == ("denied", "AGENT_DISABLED", "operator", "console")


def test_a_held_tool_is_refused_in_the_console(admin_client, demo):
    echo = _tool(demo, "echo")
    Tool.objects.filter(pk=echo.pk).update(approved_sha256="")
    mark = audit_mark()
    shown = admin_client.get(f"/admin/registry/tool/{echo.pk}/test/")
    assert 'id="tool-held"' in _page(shown) and 'id="tool-test-form"' not in _page(shown)
    assert "is held: its definition changed since it was" in _page(shown)
    ran = admin_client.post(f"/admin/registry/tool/{echo.pk}/test/", {"arguments": "{}", "confirmed": "Run it"})
    assert ran.status_code == 409 and 'id="tool-held"' in _page(ran)
    assert audit_since(mark) == []


def test_a_hostile_schema_is_escaped_and_bounded_in_the_console(admin_client, demo):
    echo = _tool(demo, "echo")
    hostile = {
        "name": "echo",
        "title": HOSTILE,
        "description": HOSTILE,
        "inputSchema": {
            "type": "object",
            "title": HOSTILE,
            "properties": {
                HOSTILE: {"type": "string", "title": HOSTILE, "description": HOSTILE + "x" * 1000},
                "choice": {"enum": [HOSTILE, 1]},
                "deep": {"type": "object", "description": "an object"},
            },
        },
    }
    Tool.objects.filter(pk=echo.pk).update(definition=hostile, title=HOSTILE, description=HOSTILE)
    for url in (f"/admin/registry/tool/{echo.pk}/test/", f"/admin/registry/tool/{echo.pk}/change/"):
        page = _page(admin_client.get(url))
        assert "<script>" not in page, url
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page, url
    form = admin_client.get(f"/admin/registry/tool/{echo.pk}/test/").context["form"]
    kinds = {form.names[name]: field.__class__.__name__ for name, field in form.fields.items()}
    assert kinds == {HOSTILE: "CharField", "choice": "TypedChoiceField", "deep": "JsonField"}
    [named] = [field for name, field in form.fields.items() if form.names[name] == HOSTILE]
    assert len(named.help_text) == 300
    many = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(31)}}
    Tool.objects.filter(pk=echo.pk).update(definition=hostile | {"inputSchema": many})
    form = admin_client.get(f"/admin/registry/tool/{echo.pk}/test/").context["form"]
    assert list(form.fields) == ["arguments"], "past 30 properties, one JSON object"
    deep = "[" * 100 + "]" * 100
    refused = admin_client.post(f"/admin/registry/tool/{echo.pk}/test/", {"arguments": deep})
    assert refused.status_code == 400 and "The JSON is nested deeper than 64 levels." in _page(refused)


def test_the_tools_list_shows_descriptions_and_the_tool_page_pretty_prints_its_definition(admin_client, demo):
    listing = _page(admin_client.get(f"/admin/registry/tool/?upstream__id__exact={demo.pk}"))
    assert "Return the text you send." in listing
    page = _page(admin_client.get(f"/admin/registry/tool/{_tool(demo, 'echo').pk}/change/"))
    assert "<pre>{\n  &quot;description&quot;: &quot;Return the text you send.&quot;," in page


def test_the_audit_list_shows_agent_and_actor_apart(admin_client):
    upstream = f"apart-{uuid.uuid4().hex[:8]}"
    audit_record(kind="approved", agent_name="agent-a", actor="operator-b", upstream=upstream)
    listing = _page(admin_client.get(f"/admin/audit/auditevent/?upstream={upstream}"))
    assert 'agent-a · <span class="actor">by operator-b</span>' in listing
