"""People signed in at the external IdP: recorded and disabled, their own rate and sessions, rules that name them
or their groups, identity providers added in the console, and the person carried through code mode, a handoff
and the Celery executor."""

import time

import anyio
import httpx2
import pytest

from policy.models import AgentGroup, IdentityProvider, Person, Rule, Team, TeamGroup
from registry.models import Upstream
from tests import servers
from tests.clients import call, sdk_client, tool_names, ws_session
from tests.factories import agent
from tests.helpers import audit_mark, audit_since, eventually, orm, until
from tests.idp import ACCEPT, CLIENTS, Idp, post_initialize, private_jwk

pytestmark = pytest.mark.e2e


def test_each_person_has_the_agents_rate_of_their_own(idp_gateway):
    idp, gateway = idp_gateway

    async def calls(token: str, count: int) -> list:
        return [await call(gateway.url, token, "demo__echo", {"text": str(n)}, "2026-07-28") for n in range(count)]

    ada, lin = idp.forge(sub="ada"), idp.forge(sub="lin")
    *served, refused = anyio.run(calls, ada, 3)
    assert [result.content[0].text for result in served] == ["0", "1"]
    assert refused.error.data["code"] == "AGENT_RATE_LIMITED"
    assert refused.error.message.startswith("You may make 2 tool calls a minute. Retry after")
    assert [result.content[0].text for result in anyio.run(calls, lin, 1)] == ["0"]  # another person is not held


def test_a_person_cannot_drive_another_persons_session(idp_gateway):
    idp, gateway = idp_gateway
    opened = post_initialize(gateway, idp.forge(sub="owner"))
    session_id = opened.headers["mcp-session-id"]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    for person, status in (("intruder", 404), ("owner", 200)):
        headers = ACCEPT | {"Authorization": f"Bearer {idp.forge(sub=person)}", "mcp-session-id": session_id}
        headers |= {"mcp-protocol-version": "2025-11-25"}
        reply = httpx2.post(f"{gateway.url}/mcp", json=listing, headers=headers, timeout=10)
        assert reply.status_code == status, person
    assert (
        "Session not found"
        in httpx2.post(
            f"{gateway.url}/mcp",
            json=listing,
            headers=ACCEPT | {"Authorization": f"Bearer {idp.forge(sub='intruder')}", "mcp-session-id": session_id},
            timeout=10,
        ).text
    )


def test_a_socket_serves_nothing_once_its_token_expires(idp_gateway):
    idp, gateway = idp_gateway
    expires = int(time.time()) + 3
    mark = audit_mark()

    async def scenario() -> tuple[dict, dict]:
        async with ws_session(gateway.url, idp.forge(sub="brief", exp=expires)) as session:
            before = await session.request("tools/call", {"name": "demo__echo", "arguments": {"text": "in time"}})
            await until(lambda: time.time() > expires, timeout=10)
            return before, await session.request("tools/list")

    def session_closed() -> list:
        return [row for row in audit_since(mark, sessions=True) if row.detail.get("action") == "session_closed"]

    before, after = anyio.run(scenario)
    assert before["result"]["content"] == [{"type": "text", "text": "in time"}]
    assert after["error"] == {
        "code": -32600,
        "message": "The token this socket was opened with has expired: sign in again and reconnect",
    }
    closed = eventually(
        lambda: [r for r in audit_since(mark, sessions=True) if r.detail.get("action") == "session_closed"]
    )
    assert closed[0].detail["reason"] == after["error"]["message"] and closed[0].person_subject == "brief"


def test_a_person_met_is_recorded_and_once_disabled_is_refused_on_the_next_call(idp_gateway):
    idp, gateway = idp_gateway
    token = idp.forge(sub="dora", name="Dora M")
    assert post_initialize(gateway, token).status_code == 200
    person = eventually(lambda: Person.objects.filter(issuer=idp.issuer, subject="dora").first())
    assert (person.name, person.enabled, person.first_seen is not None) == ("Dora M", True, True)
    person.enabled = False
    person.save()  # as the console does: the snapshot follows
    mark = audit_mark()
    try:
        refused = eventually(lambda: (reply := post_initialize(gateway, token)).status_code == 403 and reply)
    finally:
        Person.objects.filter(pk=person.pk).update(enabled=True)
        person.refresh_from_db()
        person.save()
    message = "This person is disabled in this gateway: ask its administrators"
    assert refused.json()["error"] == {"code": -32600, "message": message}
    assert "PERSON_DISABLED" in {row.error_code for row in audit_since(mark)}
    assert eventually(lambda: post_initialize(gateway, token).status_code == 200)  # enabled again


def test_an_identity_provider_registered_in_the_console_signs_people_in_until_it_is_removed(
    idp_gateway, server_env, logs
):
    _idp, gateway = idp_gateway
    key, jwk = private_jwk("second-1")
    provider = servers.start_oidc_provider(_idp.resource, {"keys": [jwk]}, CLIENTS, logs / "oidc-provider-2.log")
    second = Idp(provider.url, _idp.resource, key)
    with agent("contractors") as (contractors, _key):
        row = IdentityProvider.objects.create(name="second", issuer=second.issuer, agent=contractors)
        try:

            def listed() -> dict | None:
                metadata = httpx2.get(f"{gateway.url}/.well-known/oauth-protected-resource", timeout=5).json()
                return metadata if second.issuer in metadata["authorization_servers"] else None

            metadata = eventually(listed)
            assert sorted(metadata["authorization_servers"]) == sorted([_idp.issuer, second.issuer])
            mark = audit_mark()

            async def scenario():
                async with sdk_client(gateway.url, second.forge(sub="kim", kid="second-1"), "2026-07-28") as client:
                    return await client.call_tool("demo__echo", {"text": "second idp"})

            assert anyio.run(scenario).content[0].text == "second idp"
            [approved, *_] = [row for row in audit_since(mark) if row.tool == "echo"]
            assert (approved.agent_name, approved.person_issuer, approved.person_subject) == (
                "contractors",
                second.issuer,
                "kim",
            )
        finally:
            row.delete()
            provider.stop()
        refused = eventually(
            lambda: (reply := post_initialize(gateway, second.forge(kid="second-1"))).status_code == 401 and reply
        )
        assert refused.json()["error"]["message"] == "The token comes from an issuer this gateway does not trust"


def test_a_socket_serves_nothing_once_its_person_is_disabled(idp_gateway):
    idp, gateway = idp_gateway
    call = {"name": "demo__echo", "arguments": {"text": "still me"}}

    async def scenario() -> tuple[dict, dict]:
        async with ws_session(gateway.url, idp.forge(sub="wes")) as session:
            before = await session.request("tools/call", call)
            person = await orm(lambda: Person.objects.get(issuer=idp.issuer, subject="wes"))
            person.enabled = False
            await orm(person.save)

            async def refused() -> dict | None:
                reply = await session.request("tools/list")
                return reply if "error" in reply else None

            return before, await until(refused, timeout=10)

    try:
        before, after = anyio.run(scenario)
    finally:
        for person in Person.objects.filter(issuer=idp.issuer, subject="wes"):
            person.enabled = True
            person.save()
    assert before["result"]["content"] == [{"type": "text", "text": "still me"}]
    assert after["error"] == {
        "code": -32600,
        "message": "This person is disabled in this gateway: ask its administrators",
    }


def test_code_a_person_runs_calls_tools_as_them(idp_gateway, people):
    idp, gateway = idp_gateway
    mark = audit_mark()
    code = 'return await tools.demo.echo({ text: "from code" });'
    result = anyio.run(call, gateway.url, idp.forge(sub="coder"), "switchboard__execute", {"code": code}, "legacy")
    assert not result.is_error, result.content[0].text
    assert result.content[0].text == "from code"
    rows = [row for row in audit_since(mark) if row.kind in ("approved", "completed")]
    assert {row.exposed_name for row in rows} == {"switchboard__execute", "demo__echo"}
    assert {(row.agent_name, row.person_subject) for row in rows} == {(people, "coder")}


def _listed(gateway, token: str) -> set[str]:
    return anyio.run(tool_names, gateway.url, token)


def test_a_person_removed_from_their_teams_group_is_refused_on_their_next_call(idp_gateway):
    idp, gateway = idp_gateway
    default = Team.objects.get(slug="default")
    mapping = TeamGroup.objects.create(group="switchboard-callers", team=default, role="member")
    member, removed = idp.forge(sub="frank", groups=["switchboard-callers"]), idp.forge(sub="frank", groups=[])
    try:
        # Once the gateway has the mapping, the token without the group lists nothing; the member's, the tools.
        eventually(
            lambda: not anyio.run(tool_names, gateway.url, removed) and anyio.run(tool_names, gateway.url, member)
        )
        mark = audit_mark()
        answered = anyio.run(call, gateway.url, member, "demo__echo", {"text": "a member"}, "2026-07-28")
        refused = anyio.run(call, gateway.url, removed, "demo__echo", {"text": "x"}, "2026-07-28")
    finally:
        mapping.delete()
    assert answered.content[0].text == "a member"
    assert (refused.error.code, refused.error.data["code"]) == (-32001, "TEAM_MEMBERSHIP_REQUIRED")
    assert refused.error.message.startswith("You are not a member of team 'default', which this agent belongs to")
    rows = [(r.kind, r.error_code, r.person_subject) for r in audit_since(mark) if r.exposed_name == "demo__echo"]
    assert rows == [
        ("approved", "", "frank"),
        ("completed", "", "frank"),
        ("denied", "TEAM_MEMBERSHIP_REQUIRED", "frank"),
    ]


def test_rules_may_name_a_person_or_an_agent_group_their_idp_groups_count_them_in(idp_gateway):
    idp, gateway = idp_gateway
    demo = Upstream.objects.get(slug="demo")
    bob = Person.objects.create(issuer=idp.issuer, subject="bob", name="Bob")
    readers = AgentGroup.objects.create(name="idp-readers", idp_groups="switchboard-readers")
    rules = [
        Rule.objects.create(effect="deny", person=bob, upstream=demo, tool_pattern="echo"),
        Rule.objects.create(effect="deny", agent_group=readers, upstream=demo, tool_pattern="add"),
    ]
    tokens = {
        "bob": idp.forge(sub="bob"),
        "carol": idp.forge(sub="carol"),
        "dave": idp.forge(sub="dave", groups=["switchboard-readers"]),
    }

    async def listed(person: str) -> set[str]:
        return await tool_names(gateway.url, tokens[person])

    try:
        bob_sees = eventually(lambda: (names := anyio.run(listed, "bob")) and "demo__echo" not in names and names)
        dave_sees = eventually(lambda: (names := anyio.run(listed, "dave")) and "demo__add" not in names and names)
        carol_sees = anyio.run(listed, "carol")
        refused = anyio.run(call, gateway.url, tokens["bob"], "demo__echo", {"text": "x"}, "2026-07-28")
    finally:
        for made in (*rules, readers, bob):
            made.delete()
    assert "demo__add" in bob_sees and "demo__echo" in dave_sees
    assert {"demo__echo", "demo__add"} <= carol_sees
    assert refused.error.data["code"] == "POLICY_DENIED"


def test_a_person_hands_off_to_a_specialist_and_every_handoff_row_names_them(idp_gateway, specialists, people):
    idp, gateway = idp_gateway
    token = idp.forge(sub="hanna")
    triage, back = "switchboard__handoff_to_finance", "switchboard__return_to_triage"
    eventually(lambda: triage in anyio.run(tool_names, gateway.url, token), timeout=10)
    mark = audit_mark()

    async def scenario() -> tuple[str, set[str], str]:
        async with sdk_client(gateway.url, token, "legacy") as client:
            handed = await client.call_tool(triage, {"reason": "a budget question"})
            during = {tool.name for tool in (await client.list_tools()).tools}
            returned = await client.call_tool(back, {"note": "done"})
            return handed.content[0].text, during, returned.content[0].text

    handed, during, _returned = anyio.run(scenario)
    assert handed.startswith("Handed off to the finance specialist.")
    assert "finance__ask" in during
    moves = [row for row in audit_since(mark) if row.kind == "handoff"]
    assert {row.detail["event"] for row in moves} >= {"activated", "returned"}
    assert {(row.agent_name, row.person_subject) for row in moves} == {(people, "hanna")}


def test_a_persons_call_through_the_celery_executor_is_audited_as_them(
    idp_gateway, people, server_env, celery_worker, logs
):
    """The worker runs the upstream call; who asked stays on the web side, in both rows."""
    idp, _inline = idp_gateway
    env = servers.web_env(server_env, "celery") | {"GATEWAY_OIDC_ISSUER": idp.issuer, "GATEWAY_OIDC_AGENT": people}
    gateway = servers.start_gateway(env, logs / "gateway-oidc-celery.log")
    try:
        token = idp.forge(sub="celia", aud=f"{gateway.url}/mcp")
        mark = audit_mark()
        result = anyio.run(call, gateway.url, token, "demo__echo", {"text": "via a worker"}, "2026-07-28")
    finally:
        gateway.stop()
    assert result.content[0].text == "via a worker"
    rows = [row for row in audit_since(mark) if row.tool == "echo"]
    assert [(row.kind, row.person_subject, row.agent_name) for row in rows] == [
        ("approved", "celia", people),
        ("completed", "celia", people),
    ]
