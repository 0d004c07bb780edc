"""`export_config` and `import_config`: the whole configuration as one document, with no secret in it; a dry run
that prints the diff and writes nothing; an import that changes, audits, and changes nothing the second time;
every reference to something undefined refused, naming it, with nothing applied; credentials kept, compared or
changed; and the round trip into an empty database of its own, as real commands."""

import copy
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models import Q

from handoff.config_apply import ConfigRefused, config_apply
from handoff.models import HandoffRoute
from policy.models import Agent, AgentGroup, Person, Rule, ServerGroup, Team
from policy.services import agent_create, policy_object_save, rule_save, team_group_map
from registry.credentials import credentials_open
from registry.models import Upstream, VirtualServer
from registry.services import local_prefix_set, upstream_save, upstream_share
from tests import servers
from tests.helpers import audit_mark, audit_since, new_database

SECRETS = ("clock-s3cret", "docs-s3cret", "query-s3cret")
IMPORTER = "manage.py import_config"


def _upstream(**fields: Any) -> Upstream:
    upstream = Upstream(**fields)
    upstream.full_clean()
    upstream_save(upstream=upstream, created=True)
    return upstream


@pytest.fixture
def configured(db) -> Iterator[str]:
    """One object of every kind, named cfg-*, with credentials; the agent's API key. Removed after."""
    Group.objects.create(name="cfg-approvers")
    team = Team.objects.create(slug="cfg-pay", name="Cfg Pay", calls_per_minute=100)
    default = Team.objects.get(slug="default")
    team_group_map(group="cfg-pay-admins", team="cfg-pay", role="admin")
    money = ServerGroup(name="cfg-money", team=team, isolation="strict")
    policy_object_save(obj=money, actor="test", created=True)
    clock = _upstream(
        slug="cfg-clock",
        transport="stdio",
        command="/usr/bin/true",
        env={"API_KEY": SECRETS[0]},
        team=team,
        group=money,
    )
    _upstream(
        slug="cfg-docs",
        transport="streamable_http",
        url=f"https://docs.example.com/mcp?key={SECRETS[2]}",
        headers={"X-Api-Key": SECRETS[1]},
        timeout=12,
    )
    finance = _upstream(
        slug="cfg-finance", transport="streamable_http", url="http://127.0.0.1:9/mcp", internal=True, handoff_only=True
    )
    upstream_share(upstream=clock, teams=[default], shared_with_all=False, actor="test")
    local_prefix_set(upstream=clock, team=default, prefix="cfg-payclock", actor="test")
    issued = agent_create(name="cfg-bot", team=team)
    bots = AgentGroup(name="cfg-bots", team=team, idp_groups="ops")
    policy_object_save(obj=bots, actor="test", created=True)
    bots.agents.set([issued.agent])
    route = HandoffRoute(domain="cfg-finance", team=team, description="Money questions", target=finance)
    policy_object_save(obj=route, actor="test", created=True)
    desk = VirtualServer(name="cfg-desk", team=team, title="Desk", tools=["cfg-clock__get_*"])
    policy_object_save(obj=desk, actor="test", created=True)
    person = Person.objects.create(issuer="https://idp.example.com", subject="cfg-mallory")
    for rule in (
        Rule(effect="allow", team=team, agent=issued.agent, upstream=clock, tool_pattern="get_*"),
        Rule(effect="sign_off", team=team, agent_group=bots, server_group=money, four_eyes=True, note="two people"),
        Rule(effect="deny", person=person),
    ):
        rule.signers = Group.objects.get(name="cfg-approvers") if rule.effect == "sign_off" else None
        rule_save(rule=rule, actor="test", created=True)
    yield issued.key
    Rule.objects.filter(Q(team__slug="cfg-pay") | Q(person__subject="cfg-mallory") | Q(note="cfg")).delete()
    pairs = (
        (VirtualServer, "name"),
        (HandoffRoute, "domain"),
        (AgentGroup, "name"),
        (Agent, "name"),
        (Upstream, "slug"),
    )
    for model, key in pairs:
        model.objects.filter(**{f"{key}__startswith": "cfg-"}).delete()
    ServerGroup.objects.filter(name__startswith="cfg-").delete()
    Team.objects.filter(slug__startswith="cfg-").delete()
    Person.objects.filter(subject="cfg-mallory").delete()
    Group.objects.filter(name__startswith="cfg-").delete()


def export() -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("export_config", stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def import_lines(path: Path, *args: str) -> list[str]:
    out = io.StringIO()
    call_command("import_config", str(path), *args, stdout=out)
    return out.getvalue().splitlines()


def written(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / "configuration.json"
    path.write_text(json.dumps(document))
    return path


def test_the_export_holds_every_kind_of_object_and_no_secret(configured):
    text, err = export()
    document = json.loads(text)

    assert (document["format"], document["version"]) == ("switchboard-configuration", 1)
    assert document["teams"]["cfg-pay"] == {
        "name": "Cfg Pay",
        "callsPerMinute": 100,
        "groups": {"cfg-pay-admins": "admin"},
    }
    assert document["serverGroups"]["cfg-money"] == {"team": "cfg-pay", "isolation": "strict", "enabled": True}
    assert document["mcpServers"]["cfg-clock"] == {
        "command": "/usr/bin/true",
        "args": [],
        "env": {"API_KEY": "${CFG_CLOCK_ENV_API_KEY}"},
        "team": "cfg-pay",
        "group": "cfg-money",
        "enabled": True,
        "newTools": "hold",
        "timeout": 30.0,
        "sharedWith": ["default"],
        "localPrefixes": {"default": "cfg-payclock"},
    }
    assert document["mcpServers"]["cfg-docs"]["url"] == "https://docs.example.com/mcp?key=${CFG_DOCS_QUERY_KEY}"
    assert document["mcpServers"]["cfg-finance"]["handoffOnly"] is True
    assert document["agents"]["cfg-bot"] == {"team": "cfg-pay", "enabled": True}
    assert document["agentGroups"]["cfg-bots"] == {"team": "cfg-pay", "idpGroups": "ops", "agents": ["cfg-bot"]}
    assert document["handoffRoutes"]["cfg-finance"]["target"] == "cfg-finance"
    sign_off = next(
        rule for rule in document["rules"] if rule["effect"] == "sign_off" and rule.get("note") == "two people"
    )
    assert (sign_off["signers"], sign_off["fourEyes"], sign_off["serverGroup"]) == ("cfg-approvers", True, "cfg-money")
    deny = {"issuer": "https://idp.example.com", "subject": "cfg-mallory"}
    assert any(rule.get("person") == deny for rule in document["rules"])
    prefix = configured.split("_")[1]
    for secret in (*SECRETS, configured, prefix, "sbx1:"):
        assert secret not in text + err
    assert "never their values; agents' API keys are not written" in err
    assert "CFG_CLOCK_ENV_API_KEY, CFG_DOCS_QUERY_KEY, CFG_DOCS_HEADER_X_API_KEY" in err


def edited(document: dict[str, Any]) -> dict[str, Any]:
    """The document with one change of each sort: an agent made, one changed, a route removed, a rule changed."""
    changed = copy.deepcopy(document)
    changed["agents"]["cfg-new"] = {"team": "cfg-pay"}
    changed["agents"]["cfg-bot"]["callsPerMinute"] = 7
    del changed["handoffRoutes"]["cfg-finance"]
    allow = next(rule for rule in changed["rules"] if rule.get("agent") == "cfg-bot")
    allow["note"] = "hourly"
    return changed


EDIT_LINES = [
    "created  agent cfg-new",
    "changed  agent cfg-bot: callsPerMinute",
    "removed  handoff route cfg-finance",
    "created  rule 'allow cfg-bot → cfg-clock / get_* (hourly)'",
    "removed  rule 'allow cfg-bot → cfg-clock / get_*'",
]


def test_a_dry_run_prints_what_would_change_and_writes_nothing(configured, tmp_path):
    before = export()[0]
    mark = audit_mark()

    lines = import_lines(written(tmp_path, edited(json.loads(before))), "--dry-run")

    assert lines == [*EDIT_LINES, "dry run: 5 changes, nothing was written"]
    assert export()[0] == before
    assert audit_since(mark) == []


def test_an_import_changes_through_the_audited_services_and_a_second_one_changes_nothing(configured, tmp_path):
    path = written(tmp_path, edited(json.loads(export()[0])))
    mark = audit_mark()

    first = import_lines(path)
    rows = audit_since(mark)
    second_mark = audit_mark()
    second = import_lines(path)

    assert first == [*EDIT_LINES, "5 changes applied"]
    assert [(row.actor, row.detail["action"]) for row in rows] == [
        (IMPORTER, "rule_deleted"),
        (IMPORTER, "handoffroute_deleted"),
        (IMPORTER, "agent_saved"),
        (IMPORTER, "agent_created"),
        (IMPORTER, "rule_created"),
    ]
    assert rows[2].detail["after"] == {"calls_per_minute": 7}
    assert Agent.objects.get(name="cfg-new").keys.count() == 0
    assert second == ["nothing to change: the gateway's configuration is the document's"]
    assert audit_since(second_mark) == []


def _rule(document: dict[str, Any], effect: str) -> dict[str, Any]:
    return next(rule for rule in document["rules"] if rule["effect"] == effect and rule.get("team") == "cfg-pay")


REFUSED = {
    "rule naming an unknown server group": (
        lambda d: _rule(d, "sign_off").update(serverGroup="cfg-nowhere"),
        "rule 'sign_off cfg-bots → cfg-nowhere / * (two people)' names server group 'cfg-nowhere', which the "
        "document does not define",
    ),
    "upstream in an unknown team": (
        lambda d: d["mcpServers"]["cfg-docs"].update(team="cfg-nobody"),
        "upstream 'cfg-docs' names team 'cfg-nobody', which neither the document nor the gateway defines",
    ),
    "agent removed while a group holds it": (
        lambda d: d["agents"].pop("cfg-bot"),
        "agent group 'cfg-bots' names agent 'cfg-bot', which the document does not define",
    ),
    "route to an unknown upstream": (
        lambda d: d["handoffRoutes"]["cfg-finance"].update(target="cfg-gone"),
        "handoff route 'cfg-finance' names upstream 'cfg-gone', which the document does not define",
    ),
    "sign-off by an unknown console group": (
        lambda d: _rule(d, "sign_off").update(signers="cfg-nobody"),
        "rule 'sign_off cfg-bots → cfg-money / * (two people)' names console group 'cfg-nobody', which this "
        "gateway does not have",
    ),
    "virtual server of an unknown team": (
        lambda d: d["virtualServers"]["cfg-desk"].update(team="cfg-nobody"),
        "virtual server 'cfg-desk' names team 'cfg-nobody', which neither the document nor the gateway defines",
    ),
    "virtual server offering a tool twice": (
        lambda d: d["virtualServers"]["cfg-desk"].update(tools=["a", "a"]),
        "virtual server 'cfg-desk': tools: 'a' is listed twice.",
    ),
    "local prefix for an unknown team": (
        lambda d: d["mcpServers"]["cfg-clock"]["localPrefixes"].update({"cfg-nobody": "x"}),
        "upstream 'cfg-clock' names team 'cfg-nobody', which neither the document nor the gateway defines",
    ),
    "an unknown key": (
        lambda d: d["agents"]["cfg-bot"].update(callsPerHour=3),
        "agent 'cfg-bot': unknown key 'callsPerHour'",
    ),
    "a value of the wrong kind": (
        lambda d: d["serverGroups"]["cfg-money"].update(isolation="loose"),
        "server group 'cfg-money': isolation: Value 'loose' is not a valid choice.",
    ),
    "a newer version": (lambda d: d.update(version=2), "the document is version 2; this gateway reads up to 1"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_document_with_something_wrong_is_refused_naming_it_and_nothing_is_applied(configured, tmp_path, case):
    before = export()[0]
    document = json.loads(before)
    document["agents"]["cfg-extra"] = {"team": "cfg-pay"}  # a good change, which must not be made either
    edit, message = REFUSED[case]
    edit(document)
    path = written(tmp_path, document)
    mark = audit_mark()

    with pytest.raises(CommandError) as refused:
        import_lines(path)

    assert str(refused.value) == f"{path}: refused, nothing was applied: {message}"
    assert export()[0] == before and audit_since(mark) == []


def test_a_rule_the_model_refuses_is_refused_naming_it(configured):
    document = json.loads(export()[0])
    document["rules"].append({"effect": "allow", "agent": "cfg-bot", "agentGroup": "cfg-bots", "note": "cfg"})

    with pytest.raises(ConfigRefused) as refused:
        config_apply(document=document, actor="test")

    number = len(document["rules"])
    assert (
        str(refused.value) == f"rule {number}: Name an agent, an agent group or a person, only one: make several rules."
    )


def test_a_credential_is_kept_without_its_variable_compared_with_it_and_changed_by_a_new_value(configured):
    document = json.loads(export()[0])
    same = {"CFG_CLOCK_ENV_API_KEY": SECRETS[0]}

    kept = config_apply(document=document, actor="test", environ={})
    compared = config_apply(document=document, actor="test", environ=same)
    changed = config_apply(document=document, actor="test", environ={"CFG_CLOCK_ENV_API_KEY": "new-value"})

    assert kept == [] and compared == []
    assert [change.line() for change in changed] == ["changed  upstream cfg-clock: env.API_KEY"]
    assert credentials_open(Upstream.objects.get(slug="cfg-clock").env) == {"API_KEY": "new-value"}


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(servers.ROOT / "manage.py"), *args]
    done = subprocess.run(command, env=env, cwd=servers.ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_export_imported_into_an_empty_database_exports_the_same(configured, server_env, tmp_path):
    text, err = export()
    variables = err.splitlines()[-1].partition(": ")[2].split(", ")
    values = dict.fromkeys(variables, "elsewhere") | {"CFG_CLOCK_ENV_API_KEY": SECRETS[0]}
    path = tmp_path / "configuration.json"
    path.write_text(text)

    with new_database(server_env, "config", tmp_path) as env:
        manage(env, "migrate", "-v0")
        manage(
            env,
            "shell",
            "-c",
            "from django.contrib.auth.models import Group; Group.objects.create(name='cfg-approvers')",
        )
        imported = manage(env | values, "import_config", str(path))
        again = manage(env, "export_config").stdout
        verified = manage(env, "audit_verify").stdout

    assert "created  upstream cfg-clock" in imported.stdout.splitlines()
    assert json.loads(again) == json.loads(text)
    assert verified.startswith("Audit trail intact")
