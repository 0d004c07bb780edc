"""What operators type: names of agents, groups and rules' notes hold only characters a person sees (the
admin, the REST API and the commands refuse the rest with the same message), and the upstream form shows
what it means (empty objects, help text as written)."""

import pytest
from django.core.management import CommandError, call_command

from policy.models import Agent, AgentGroup, ServerGroup
from tests.clients import api


def test_the_admin_refuses_an_agent_name_with_a_control_character(admin_client):
    response = admin_client.post("/admin/policy/agent/add/", {"name": "cursor\x07laptop", "keys-TOTAL_FORMS": "0",
                                                              "keys-INITIAL_FORMS": "0"})  # fmt: skip
    assert response.status_code == 200, "the form comes back"
    assert "Use visible characters only: this holds U+0007 (a control character)." in response.content.decode()
    assert not Agent.objects.filter(name__startswith="cursor").exists()


def test_the_admin_refuses_server_and_agent_group_names_with_invisible_characters(admin_client):
    group = admin_client.post("/admin/policy/servergroup/add/", {"name": "vault\u202e", "isolation": "strict"})
    agents = admin_client.post("/admin/policy/agentgroup/add/", {"name": "te\u00adam"})
    assert "this holds U+202E (RIGHT-TO-LEFT OVERRIDE)." in group.content.decode()
    assert "this holds U+00AD (SOFT HYPHEN)." in agents.content.decode()
    assert not ServerGroup.objects.filter(name__startswith="vault").exists()
    assert not AgentGroup.objects.filter(name__startswith="te").exists()


def test_the_api_refuses_names_and_notes_with_invisible_characters(inline_gateway, admin_token):
    agent = api(inline_gateway, "POST", "agents", admin_token, json={"name": "api\u200bbot"})
    group = api(inline_gateway, "POST", "groups", admin_token, json={"name": "%C2%8A\u008a"})
    rule = api(inline_gateway, "POST", "rules", admin_token, json={"effect": "deny", "note": "why\nnot"})
    assert (agent.status_code, agent.json()) == (
        400,
        {"name": ["Use visible characters only: this holds U+200B (ZERO WIDTH SPACE)."]},
    )
    assert (group.status_code, group.json()) == (
        400,
        {"name": ["Use visible characters only: this holds U+008A (a control character)."]},
    )
    assert (rule.status_code, rule.json()) == (
        400,
        {"note": ["Use visible characters only: this holds U+000A (a control character)."]},
    )


def test_create_agent_refuses_a_name_with_an_escape_sequence(db):
    with pytest.raises(CommandError) as refused:
        call_command("create_agent", "bad\x1b[31mname")
    assert str(refused.value) == (
        "The name 'bad\\x1b[31mname' is refused: Use visible characters only: this holds U+001B (a control character)."
    )
    assert not Agent.objects.filter(name__startswith="bad").exists()


def test_a_new_upstream_form_starts_with_empty_objects_and_shows_its_help_text_as_written(admin_client):
    page = admin_client.get("/admin/registry/upstream/add/").content.decode()
    for name in ("env", "headers", "query"):
        assert f'id="id_{name}">\n{{}}</textarea>' in page, name
    assert "Expose names as slug, separator, name (time__get_current_time)." in page


def test_create_agent_refuses_a_name_with_spaces_around_it(db):
    with pytest.raises(CommandError) as refused:
        call_command("create_agent", " padded ")
    assert str(refused.value) == "The name ' padded ' is refused: Remove the spaces at the start or end."
