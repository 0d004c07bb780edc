"""Per-person upstreams with pasted personal tokens: each person reaches the upstream as themselves, through both
executors and both eras; a call without a credential is refused with its connect link (as URL-mode elicitation
where the client declared it) and can be retried once connected; revoked credentials are refused; a replace, a
disconnect and a revoke take effect for the very next call; whatever the upstream says quoting the token reaches the
agent scrubbed; the catalog syncs through the admin's designated connection; no token reaches a log or an audit row."""

import json
import re
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from django.contrib.auth import get_user_model
from mcp import UrlElicitationRequiredError, types
from mcp.shared.exceptions import MCPError

from policy.models import Agent
from policy.services import agent_key_issue
from registry.models import PersonalCredential, Upstream
from registry.personal import personal_connect
from registry.services import upstream_catalog_sync, upstream_save
from tests import servers
from tests.clients import api, call, sdk_client, tool_names
from tests.factories import person_upstream
from tests.helpers import audit_mark, audit_since, eventually
from tests.otlp import CALLED, REFUSED_AT_DECIDE, stages_of

pytestmark = pytest.mark.e2e

TOKENS = {"alice": "tok-alice-3f9a7c1e5b", "bob": "tok-bob-8d2e6a4f0c"}
ADMIN_TOKEN = "tok-admin-0e4c7b9a2d"  # the upstream shows its account one tool more (reports)
NEW_TOKEN = "tok-bob-new-71c3e9a5d4"  # the token Bob replaces his with: the upstream names its holder "bob-new"
SLUG = "tracker"
WHOAMI = f"{SLUG}__whoami"


@pytest.fixture(scope="module")
def tracker(db, logs) -> dict:
    """The protected upstream (static tokens), per person; Alice and Bob with personal keys; Alice's connection
    designated to sync its catalog."""
    seen = logs / "tracker-seen.log"
    tokens = TOKENS | {"admin": ADMIN_TOKEN, "bob-new": NEW_TOKEN}
    running = servers.start_protected_upstream("http://127.0.0.1:9", logs / "tracker.log", tokens=tokens, seen=seen)
    agent = Agent.objects.get_or_create(name="people")[0]
    users = {name: get_user_model().objects.create_user(f"{name}-pp", first_name=name.title()) for name in TOKENS}
    keys = {name: agent_key_issue(agent=agent, owner=user, actor="tests").key for name, user in users.items()}
    upstream = person_upstream(SLUG, ADMIN_TOKEN, transport="streamable_http", url=running.url, internal=True)
    try:
        yield {"upstream": upstream, "users": users, "keys": keys, "seen": seen}
    finally:
        upstream.delete()
        for user in users.values():
            user.delete()
        running.stop()


def _connect(tracker: dict, name: str, gateway, upstream: Upstream | None = None) -> PersonalCredential:
    """The person's token stored as the personal key's owner is named at `gateway` (its URL is their issuer)."""
    user = tracker["users"][name]
    return personal_connect(
        upstream=upstream or tracker["upstream"],
        issuer=gateway.url,
        subject=str(user.pk),
        name=user.first_name,
        kind="token",
        values={"token": TOKENS[name]},
    )


def test_the_catalog_syncs_only_through_a_designated_connection(tracker, inline_gateway):
    upstream = Upstream(slug="tracker-two", transport="streamable_http", url=tracker["upstream"].url, internal=True)
    upstream.per_person = True
    upstream_save(upstream=upstream, created=True)
    try:
        report = upstream_catalog_sync(upstream=upstream)
        assert not report.ok
        assert "tracker-two is per person: choose whose connection syncs its catalog (an admin's own)" in report.error
        upstream.catalog_credential = _connect(tracker, "alice", inline_gateway, upstream)
        upstream_save(upstream=upstream)
        report = upstream_catalog_sync(upstream=upstream)
        assert report.ok and report.added == ["whoami"], report.summary()
    finally:
        upstream.delete()


def _listed(gateway, key: str) -> None:
    """Wait until the gateway's snapshot offers the upstream's tool (it sees a new upstream within a second)."""
    eventually(lambda: WHOAMI in anyio.run(tool_names, gateway.url, key))


def _whoami(result) -> str:
    return json.loads(result.content[0].text)["person"]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_each_person_reaches_the_upstream_as_themselves(tracker, gateway, mode):
    _listed(gateway, tracker["keys"]["bob"])
    for name in TOKENS:
        _connect(tracker, name, gateway)
    mark = audit_mark()

    async def both() -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}

        async def calls(name: str) -> None:
            async with sdk_client(gateway.url, tracker["keys"][name], mode) as client:
                found[name] = [_whoami(await client.call_tool(WHOAMI, {})) for _ in range(3)]

        async with anyio.create_task_group() as tg:
            for name in TOKENS:
                tg.start_soon(calls, name)
        return found

    assert anyio.run(both) == {"alice": ["alice"] * 3, "bob": ["bob"] * 3}

    def completed() -> list:
        rows = [r for r in audit_since(mark) if r.kind == "completed" and r.tool == "whoami"]
        return rows if len(rows) == 6 else []

    rows = eventually(completed)
    theirs = PersonalCredential.objects.filter(upstream=tracker["upstream"], person_issuer=gateway.url)
    credentials = {(c.person_name, c.pk) for c in theirs}
    assert {(r.person_name, r.detail["credential"]["id"]) for r in rows} == credentials
    assert all(r.detail["credential"]["kind"] == "token" for r in rows)
    dumped = json.dumps([r.detail for r in audit_since(mark)]) + " ".join(r.error_detail for r in audit_since(mark))
    assert not any(token in dumped for token in TOKENS.values())


def _refusal(gateway, key: str) -> MCPError | None:
    """How a call of WHOAMI is refused, or None while it is not."""
    outcome = anyio.run(call, gateway.url, key, WHOAMI)
    return outcome if isinstance(outcome, MCPError) else None


def test_without_a_credential_the_call_is_refused_with_the_link_and_audited(tracker, inline_gateway):
    _listed(inline_gateway, tracker["keys"]["bob"])
    PersonalCredential.objects.filter(upstream=tracker["upstream"], person_name="Bob").delete()
    mark = audit_mark()

    refused = _refusal(inline_gateway, tracker["keys"]["bob"])
    assert refused.error.code == -32001
    assert refused.error.data["code"] == "CREDENTIAL_REQUIRED"
    link = refused.error.data["connectUrl"]
    assert link.startswith(f"{inline_gateway.url}/account/connections/{SLUG}/?for=")
    assert refused.error.message == (
        f"{SLUG} acts as each person: connect your account at {link}, then call {WHOAMI} again."
    )
    row = eventually(lambda: [r for r in audit_since(mark) if r.kind == "denied"])[0]
    assert (row.error_code, row.person_name) == ("CREDENTIAL_REQUIRED", "Bob")


def test_a_tool_the_persons_own_account_lacks_is_refused_by_the_upstream_in_its_words(tracker, inline_gateway):
    _listed(inline_gateway, tracker["keys"]["alice"])
    _connect(tracker, "alice", inline_gateway)

    async def calls() -> tuple:
        async with sdk_client(inline_gateway.url, tracker["keys"]["alice"], "legacy") as client:
            listed = {tool.name for tool in (await client.list_tools()).tools if tool.name.startswith(SLUG)}
            lacking = await client.call_tool(f"{SLUG}__reports", {})  # in the catalog (the admin's account has it)
            with pytest.raises(MCPError) as unknown:  # in no catalog: refused before any upstream
                await client.call_tool(f"{SLUG}__payroll", {})
            return listed, lacking, unknown.value

    listed, lacking, unknown = anyio.run(calls)
    assert listed == {WHOAMI, f"{SLUG}__reports"}
    assert lacking.is_error and json.loads(lacking.content[0].text) == {"error": "No tool reports for alice"}
    assert unknown.error.data["code"] == "TOOL_NOT_FOUND"


def test_resources_of_a_per_person_upstream_are_each_persons_own(tracker, inline_gateway, world):
    _listed(inline_gateway, tracker["keys"]["alice"])
    _connect(tracker, "alice", inline_gateway)
    PersonalCredential.objects.filter(upstream=tracker["upstream"], person_name="Bob").delete()
    notes = f"{SLUG}+notes://mine"

    async def resources(key: str) -> tuple[set[str], object]:
        async with sdk_client(inline_gateway.url, key, "legacy") as client:
            listed = {str(r.uri) for r in (await client.list_resources()).resources}
            try:
                read = (await client.read_resource(notes)).contents[0].text
            except MCPError as refused:
                read = refused
            return listed, read

    alice_listed, alice_read = anyio.run(resources, tracker["keys"]["alice"])
    assert notes in alice_listed and alice_read == "the notes of alice"
    bob_listed, bob_read = anyio.run(resources, tracker["keys"]["bob"])  # not connected: not listed, not read
    assert notes not in bob_listed
    assert bob_read.error.data["code"] == "CREDENTIAL_REQUIRED" and "connectUrl" in bob_read.error.data
    agent_listed, agent_read = anyio.run(resources, world.key)  # an agent's key names nobody
    assert notes not in agent_listed and agent_read.error.data["code"] == "PERSON_REQUIRED"


def test_an_agent_key_naming_no_person_is_refused(tracker, inline_gateway, world):
    _listed(inline_gateway, world.key)

    refused = _refusal(inline_gateway, world.key)
    assert refused is not None and refused.error.data["code"] == "PERSON_REQUIRED"
    assert refused.error.message == (
        f"{SLUG} acts as each person, and this API key names nobody: sign in with OAuth, or use a personal key."
    )


def _api_connect(gateway, key: str, token: str) -> httpx2.Response:
    return api(gateway, "PUT", f"my/connections/{SLUG}", key, json={"token": token})


def test_a_2025_client_is_asked_by_url_elicitation_and_retries_once_connected(tracker, gateway):
    _listed(gateway, tracker["keys"]["bob"])
    PersonalCredential.objects.filter(upstream=tracker["upstream"], person_name="Bob").delete()

    async def elicited(context, params):  # declares URL-mode elicitation; never asked at 2025-11-25
        raise AssertionError("a 2025-11-25 session is told with -32042, not asked")

    async def scenario() -> tuple[UrlElicitationRequiredError, str]:
        async with sdk_client(gateway.url, tracker["keys"]["bob"], "legacy", elicitation_callback=elicited) as client:
            with pytest.raises(MCPError) as asked:
                await client.call_tool(WHOAMI, {})
            reply = await anyio.to_thread.run_sync(_api_connect, gateway, tracker["keys"]["bob"], TOKENS["bob"])
            assert reply.status_code == 200, reply.text
            return UrlElicitationRequiredError.from_error(asked.value.error), _whoami(
                await client.call_tool(WHOAMI, {})
            )

    asked, after = anyio.run(scenario)
    assert asked.error.code == -32042
    (elicitation,) = asked.elicitations
    assert elicitation.mode == "url" and f"/account/connections/{SLUG}/?for=" in elicitation.url
    assert elicitation.message.startswith(f"{SLUG} acts as each person: connect your account at")
    assert after == "bob"


def test_a_2026_client_gets_an_input_required_url_elicitation_and_its_retry_runs_afresh(tracker, gateway, traces):
    _listed(gateway, tracker["keys"]["bob"])
    PersonalCredential.objects.filter(upstream=tracker["upstream"], person_name="Bob").delete()
    asked: list[types.ElicitRequestURLParams] = []
    mark = audit_mark()

    async def elicited(context, params):
        asked.append(params)
        reply = await anyio.to_thread.run_sync(_api_connect, gateway, tracker["keys"]["bob"], TOKENS["bob"])
        assert reply.status_code == 200, reply.text
        return types.ElicitResult(action="accept")

    async def scenario() -> str:
        client = sdk_client(gateway.url, tracker["keys"]["bob"], "2026-07-28", elicitation_callback=elicited)
        async with client as session:
            return _whoami(await session.call_tool(WHOAMI, {}))

    assert anyio.run(scenario) == "bob"
    (params,) = asked
    assert params.mode == "url" and f"/account/connections/{SLUG}/?for=" in params.url
    # Asking to connect is the decide stage refusing; the retry is a call of its own, through every stage.
    rows = [row for row in audit_since(mark) if row.exposed_name == WHOAMI]
    assert [(row.kind, row.error_code) for row in rows] == [
        ("denied", "CREDENTIAL_REQUIRED"),
        ("approved", ""),
        ("completed", ""),
    ]
    assert stages_of(traces, rows[0].trace_id) == {f"tools/call {WHOAMI}": REFUSED_AT_DECIDE}
    assert stages_of(traces, rows[1].trace_id) == {f"tools/call {WHOAMI}": CALLED}


def test_a_revoked_credential_is_refused_until_the_person_connects_again(tracker, inline_gateway, admin_token):
    _listed(inline_gateway, tracker["keys"]["bob"])
    credential = _connect(tracker, "bob", inline_gateway)
    revoked = api(inline_gateway, "POST", f"connections/{credential.pk}/revoke", admin_token)
    assert revoked.status_code == 200 and revoked.json()["revoked_by"] == "operator"

    refused = _refusal(inline_gateway, tracker["keys"]["bob"])
    assert refused.error.data["code"] == "CREDENTIAL_REVOKED"
    assert refused.error.message.startswith(f"An administrator revoked your connection to {SLUG}: connect again at")
    listed = api(inline_gateway, "GET", "my/connections", tracker["keys"]["bob"]).json()
    assert [(c["upstream"], c["revoked_by"]) for c in listed] == [(SLUG, "operator")]
    assert "token" not in json.dumps(listed).replace('"kind": "token"', "")


def test_the_personal_api_refuses_what_it_must(tracker, inline_gateway, world):
    bob = tracker["keys"]["bob"]
    assert _api_connect(inline_gateway, world.key, "x" * 20).status_code == 401  # an agent's key has no owner
    bad = _api_connect(inline_gateway, bob, "two words")
    assert bad.status_code == 400
    assert bad.json() == {"token": ["A token is one line of visible characters, without spaces."]}
    missing = api(inline_gateway, "PUT", "my/connections/nowhere", bob, json={"token": "abc"})
    assert (missing.status_code, missing.json()) == (404, {"detail": "No enabled per-person upstream 'nowhere'."})
    assert api(inline_gateway, "GET", "connections", bob).status_code == 401  # the admin API takes no personal key


def test_no_personal_token_reaches_any_log_and_the_upstream_saw_only_its_own(tracker, logs):
    seen = Path(tracker["seen"]).read_text()
    assert set(re.findall(r"Bearer (\S+)", seen)) <= {*TOKENS.values(), ADMIN_TOKEN, NEW_TOKEN}
    for log in logs.glob("*.log"):
        if log.name.startswith("tracker"):
            continue
        text = log.read_text(errors="replace")
        assert not any(token in text for token in [*TOKENS.values(), NEW_TOKEN]), log.name


def _holder(gateway, key: str, mode: str) -> str | MCPError:
    """Whose token the upstream received for one call of WHOAMI (in a session of its own, or a 2026-07-28 request),
    or the refusal."""
    outcome = anyio.run(call, gateway.url, key, WHOAMI, None, mode)
    return outcome if isinstance(outcome, MCPError) else _whoami(outcome)


@pytest.fixture(scope="module")
def twins(tracker, server_env, logs) -> Iterator[dict[str, servers.Running]]:
    started: dict[str, servers.Running] = {}
    yield started
    for running in started.values():
        running.stop()


@pytest.fixture
def twin(request, gateway, twins, server_env, logs) -> servers.Running:
    """A second web process beside `gateway`, under its public URL (so a person is the same person at both), and as
    slow to look again at what it may lag on as it can be (GATEWAY_SNAPSHOT_CHECK_SECONDS): a change made through
    `gateway` must reach a call made through it at once all the same. Started after the tracker's setup, which its
    snapshot holds."""
    executor = request.node.callspec.params["gateway"]
    if executor not in twins:
        lagging = {"GATEWAY_PUBLIC_URL": gateway.url, "GATEWAY_SNAPSHOT_CHECK_SECONDS": "3600"}
        env = servers.web_env(server_env, executor) | lagging
        twins[executor] = servers.start_gateway(env, logs / f"gateway-{executor}-twin.log")
    return twins[executor]


def _bob_served(tracker: dict, gateway, twin, mode: str) -> str:
    """Bob connected with his first token, and served with it through `twin`: its executor holds a connection that
    carries it."""
    _listed(twin, tracker["keys"]["bob"])
    _connect(tracker, "bob", gateway)
    assert _holder(twin, tracker["keys"]["bob"], mode) == "bob"
    return tracker["keys"]["bob"]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_a_replaced_token_is_the_one_the_very_next_call_carries(tracker, gateway, twin, mode):
    bob = _bob_served(tracker, gateway, twin, mode)
    assert _api_connect(gateway, bob, NEW_TOKEN).status_code == 200
    assert _holder(twin, bob, mode) == "bob-new"


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_a_disconnect_refuses_the_very_next_call_with_the_link(tracker, gateway, twin, mode):
    bob = _bob_served(tracker, gateway, twin, mode)
    assert api(gateway, "DELETE", f"my/connections/{SLUG}", bob).status_code == 204

    refused = _holder(twin, bob, mode)
    assert isinstance(refused, MCPError), refused
    assert (refused.error.code, refused.error.data["code"]) == (-32001, "CREDENTIAL_REQUIRED")
    link = refused.error.data["connectUrl"]
    assert refused.error.message == (
        f"{SLUG} acts as each person: connect your account at {link}, then call {WHOAMI} again."
    )


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_a_revoke_refuses_the_very_next_call(tracker, gateway, twin, admin_token, mode):
    bob = _bob_served(tracker, gateway, twin, mode)
    credential = PersonalCredential.objects.get(
        upstream=tracker["upstream"], person_issuer=gateway.url, person_name="Bob"
    )
    assert api(gateway, "POST", f"connections/{credential.pk}/revoke", admin_token).status_code == 200

    refused = _holder(twin, bob, mode)
    assert isinstance(refused, MCPError), refused
    assert (refused.error.code, refused.error.data["code"]) == (-32001, "CREDENTIAL_REVOKED")
    link = refused.error.data["connectUrl"]
    assert refused.error.message == (
        f"An administrator revoked your connection to {SLUG}: connect again at {link}, then call {WHOAMI} again."
    )


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_after_a_disconnect_the_new_token_is_used_and_the_deleted_one_never_again(tracker, gateway, twin, mode):
    """The deleted credential had a higher version (2) than the new one (1): a version alone does not tell them."""
    bob = _bob_served(tracker, gateway, twin, mode)
    assert _api_connect(gateway, bob, NEW_TOKEN).status_code == 200
    assert _holder(twin, bob, mode) == "bob-new"
    assert api(gateway, "DELETE", f"my/connections/{SLUG}", bob).status_code == 204
    seen_before = Path(tracker["seen"]).read_text()
    assert _api_connect(gateway, bob, TOKENS["bob"]).status_code == 200

    assert [_holder(twin, bob, mode) for _ in range(2)] == ["bob", "bob"]
    assert NEW_TOKEN not in Path(tracker["seen"]).read_text()[len(seen_before) :]


def test_a_result_a_resource_and_a_prompt_quoting_the_credential_reach_the_agent_scrubbed(tracker, gateway):
    _listed(gateway, tracker["keys"]["alice"])
    _connect(tracker, "alice", gateway)

    async def quoted() -> list[str]:
        async with sdk_client(gateway.url, tracker["keys"]["alice"], "legacy") as client:
            result = await client.call_tool(WHOAMI, {"quote": True})
            resource = await client.read_resource(f"{SLUG}+key://mine")
            prompt = await client.get_prompt(f"{SLUG}__key")
            return [
                json.loads(result.content[0].text)["said"],
                resource.contents[0].text,
                prompt.messages[0].content.text,
            ]

    assert anyio.run(quoted) == ["your key is [credential]"] * 3
