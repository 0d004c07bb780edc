"""Names across teams (issue 36): a team may give an upstream shared with it a local prefix, under which its agents
see and call that upstream's tools; sharing an upstream with a team that already uses one of its names is refused
(by the service, the REST API and the console's form) until the team gives it a local prefix; a team's own upstream
that would take a name shared into it is refused at sync; every local prefix change is an audit row."""

from collections.abc import Iterator
from dataclasses import dataclass

import anyio
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.exceptions import ValidationError
from django.utils import timezone
from mcp import types
from mcp.shared.exceptions import MCPError

from handoff.snapshot import snapshot_compile
from policy.models import Team, TeamMember
from policy.services import admin_token_issue
from registry.models import LocalPrefix, Tool, Upstream
from registry.services import local_prefix_set, upstream_share
from tests.clients import api, call, sdk_client, tool_names
from tests.factories import agent, demo_upstream
from tests.helpers import audit_mark, audit_since, eventually, run

REFUSED = (
    "Team 'ops' already uses books__read: sharing 'books' with it would expose it twice. Its admin can give "
    "'books' a local prefix first, then share it again."
)


@dataclass
class Names:
    payments: Team  # owns snap-ledger (tool `read`), shared with ops
    ops: Team  # borrows snap-ledger under its local prefix `books`; owns mine (tool `read`)
    shop: Team  # owns books (tool `read`), not shared yet
    ledger: Upstream
    books: Upstream
    mine: Upstream


def _upstream(slug: str, team: Team, *tools: str) -> Upstream:
    upstream = Upstream.objects.create(slug=slug, transport="stdio", command="x", team=team)
    for name in tools:
        definition = {"name": name, "description": f"The {name} tool.", "inputSchema": {"type": "object"}}
        Tool.objects.create(
            upstream=upstream, name=name, definition=definition, definition_sha256=f"sha-{name}",
            approved_sha256=f"sha-{name}", last_seen_at=timezone.now(),
        )  # fmt: skip
    return upstream


@pytest.fixture
def names(db) -> Iterator[Names]:
    teams = [Team.objects.create(slug=slug, name=slug.title()) for slug in ("payments", "ops", "shop")]
    payments, ops, shop = teams
    ledger = _upstream("snap-ledger", payments, "read")
    ledger.shared_with.add(ops)
    local_prefix_set(upstream=ledger, team=ops, prefix="books", actor="olga")
    yield Names(payments, ops, shop, ledger, _upstream("books", shop, "read"), _upstream("mine", ops, "read"))
    Upstream.objects.filter(team__in=teams).delete()
    Team.objects.filter(pk__in=[team.pk for team in teams]).delete()


def test_sharing_is_refused_while_the_borrower_uses_a_name_until_it_gives_the_upstream_a_local_prefix(names):
    with pytest.raises(ValidationError) as refused:
        upstream_share(upstream=names.books, teams=[names.ops], shared_with_all=False, actor="sam")
    with pytest.raises(ValidationError) as refused_for_all:  # shared with all: every team is asked
        upstream_share(upstream=names.books, teams=[], shared_with_all=True, actor="sam")
    unshared = list(names.books.shared_with.all()), Upstream.objects.get(pk=names.books.pk).shared_with_all
    local_prefix_set(upstream=names.books, team=names.ops, prefix="shop-books", actor="olga")
    upstream_share(upstream=names.books, teams=[names.ops], shared_with_all=False, actor="sam")

    assert refused.value.message_dict == {"shared_with": [REFUSED]}
    assert refused_for_all.value.message_dict == {"shared_with": [REFUSED]}
    assert unshared == ([], False)
    assert list(names.books.shared_with.all()) == [names.ops]


def test_a_borrowers_agents_see_the_upstream_under_its_local_prefix_and_the_owners_under_its_own_name(names):
    local_prefix_set(upstream=names.books, team=names.ops, prefix="shop-books", actor="olga")
    upstream_share(upstream=names.books, teams=[names.ops], shared_with_all=False, actor="sam")
    with agent("ops-bot", team=names.ops) as (ops_bot, _), agent("shop-bot", team=names.shop) as (shop_bot, _):
        with agent("payer", team=names.payments) as (payer, _):
            snap = snapshot_compile()
            ids = ops_bot.id, shop_bot.id, payer.id  # a deleted agent's id is None

    def seen(agent_id: int) -> dict[str, str]:
        listed = {tool["name"] for tool in snap.visible_for(agent_id)}
        return {name: snap.decide(agent_id, name)[2] for name in listed if name.endswith("__read")}

    assert seen(ids[0]) == {"books__read": "snap-ledger", "shop-books__read": "books", "mine__read": "mine"}
    assert seen(ids[1]) == {"books__read": "books"}
    assert seen(ids[2]) == {"snap-ledger__read": "snap-ledger"}
    denial, entry, _ = snap.decide(ids[0], "snap-ledger__read")  # renamed for ops: no longer its name
    assert (denial.code, entry) == ("TOOL_NOT_FOUND", None)
    assert snap.decide(ids[0], "books__read")[1].route.tool == "read"


def test_a_local_prefix_change_is_audited_and_one_that_takes_a_used_name_is_refused(names):
    mark = audit_mark()
    local_prefix_set(upstream=names.ledger, team=names.ops, prefix="ledger-books", actor="olga")
    with pytest.raises(ValidationError) as taken:
        local_prefix_set(upstream=names.ledger, team=names.ops, prefix="mine", actor="olga")
    with pytest.raises(ValidationError) as own:
        local_prefix_set(upstream=names.mine, team=names.ops, prefix="my", actor="olga")
    local_prefix_set(upstream=names.ledger, team=names.ops, prefix="", actor="olga")  # its own namespace again
    rows = [row for row in audit_since(mark) if row.detail.get("action") == "local_prefix_set"]

    assert taken.value.message_dict == {"prefix": ["Team 'ops' already uses mine__read: choose another local prefix."]}
    assert own.value.message_dict == {"prefix": ["A team names its own upstream by its slug: change the slug instead."]}
    assert [(row.actor, row.team, row.upstream, row.detail) for row in rows] == [
        ("olga", "ops", "snap-ledger", {"action": "local_prefix_set", "team": "ops", "before": "books",
                                        "after": "ledger-books"}),
        ("olga", "ops", "snap-ledger", {"action": "local_prefix_set", "team": "ops", "before": "ledger-books",
                                        "after": ""}),
    ]  # fmt: skip
    assert not LocalPrefix.objects.filter(team=names.ops).exists()


def test_the_console_form_refuses_a_share_whose_names_the_borrower_uses(admin_client, names):
    form = {"slug": "books", "team": names.shop.pk, "shared_with": [names.ops.pk], "transport": "stdio"}
    form |= {"command": "x", "timeout": "5", "new_tools": "hold", "person_connect": "token", "prefixed": "on"}
    form |= {"person_slot": "bearer", "person_client": "{}", "tools-TOTAL_FORMS": "0", "tools-INITIAL_FORMS": "0"}
    response = admin_client.post(f"/admin/registry/upstream/{names.books.pk}/change/", form)
    assert response.status_code == 200  # the form again, with its error
    assert REFUSED.replace("'", "&#x27;") in response.content.decode()
    assert not names.books.shared_with.exists()


def test_the_console_gives_renames_and_takes_away_a_local_prefix_through_the_service(admin_client, names):
    row = LocalPrefix.objects.get(team=names.ops)  # "books", for snap-ledger
    taken = admin_client.post(f"/admin/registry/localprefix/{row.pk}/change/", {"prefix": "mine"})
    assert taken.status_code == 200  # the form again, with the service's words
    assert "Team &#x27;ops&#x27; already uses mine__read: choose another local prefix." in taken.content.decode()
    mark = audit_mark()
    renamed = admin_client.post(f"/admin/registry/localprefix/{row.pk}/change/", {"prefix": "ledger"})
    assert renamed.status_code == 302 and LocalPrefix.objects.get(pk=row.pk).prefix == "ledger"
    gone = admin_client.post(f"/admin/registry/localprefix/{row.pk}/delete/", {"post": "yes"})
    assert gone.status_code == 302 and not LocalPrefix.objects.filter(pk=row.pk).exists()
    rows = [row.detail for row in audit_since(mark) if row.detail.get("action") == "local_prefix_set"]
    assert [(detail["before"], detail["after"]) for detail in rows] == [("books", "ledger"), ("ledger", "")]


def _operator(name: str, team: Team, *codenames: str) -> tuple[object, str]:
    user = get_user_model().objects.create_user(name, password=f"{name}-pw-for-tests")
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    TeamMember.objects.create(user=user, team=team, role="admin")
    return user, admin_token_issue(user=user, actor="tests")


def test_the_api_refuses_the_share_until_the_borrower_gives_a_local_prefix(inline_gateway, names):
    sam, sam_token = _operator("sam", names.shop, "view_upstream", "add_upstream", "change_upstream")
    olga, olga_token = _operator("olga", names.ops, "view_localprefix", "add_localprefix", "change_localprefix")
    try:
        share = {"shared_with": ["ops"]}
        refused = api(inline_gateway, "POST", "upstreams/books/share", sam_token, json=share)
        foreign = api(inline_gateway, "POST", "local-prefixes", olga_token,
                      json={"upstream": "books", "team": "shop", "prefix": "x"})  # fmt: skip
        given = api(inline_gateway, "POST", "local-prefixes", olga_token, json={"upstream": "books", "prefix": "sb"})
        renamed = api(inline_gateway, "PATCH", f"local-prefixes/{given.json()['id']}", olga_token,
                      json={"prefix": "shop-books"})  # fmt: skip
        listed = api(inline_gateway, "GET", "local-prefixes", olga_token).json()
        shared = api(inline_gateway, "POST", "upstreams/books/share", sam_token, json=share)
    finally:
        sam.delete()
        olga.delete()
    assert (refused.status_code, refused.json()) == (400, {"shared_with": [REFUSED]})
    assert foreign.status_code == 403
    assert (given.status_code, given.json()["team"], given.json()["prefix"]) == (201, "ops", "sb")
    assert (renamed.status_code, renamed.json()["prefix"]) == (200, "shop-books")
    assert sorted((row["upstream"], row["prefix"]) for row in listed) == [("books", "shop-books"),
                                                                          ("snap-ledger", "books")]  # fmt: skip
    assert (shared.status_code, shared.json()) == (200, {"shared_with": ["ops"], "shared_with_all": False})


@pytest.fixture
def ops(db) -> Iterator[Team]:
    team = Team.objects.create(slug="ops", name="Ops")
    yield team
    Upstream.objects.get(slug="demo").shared_with.remove(team)
    Upstream.objects.filter(team=team).delete()
    team.delete()


def test_a_borrower_lists_and_calls_a_shared_upstream_by_its_local_prefix_over_mcp(inline_gateway, world, ops):
    demo = Upstream.objects.get(slug="demo")
    demo.shared_with.add(ops)
    local_prefix_set(upstream=demo, team=ops, prefix="mirror", actor="olga")
    with agent("ops-mirror-bot", team=ops) as (_, key):
        eventually(lambda: "mirror__echo" in run(lambda: tool_names(inline_gateway.url, key)), timeout=10)
        listed = run(lambda: tool_names(inline_gateway.url, key))
        answered = run(lambda: call(inline_gateway.url, key, "mirror__echo", {"text": "by my name"}))
        searched = run(lambda: call(inline_gateway.url, key, "switchboard__search_tools", {"query": "echo", "k": 20}))
        code = 'return await tools.mirror.echo({ text: "from code" });'
        coded = run(lambda: call(inline_gateway.url, key, "switchboard__execute", {"code": code}))
        old_name = run(lambda: call(inline_gateway.url, key, "demo__echo", {"text": "by its own"}))
        owners = run(lambda: tool_names(inline_gateway.url, world.key))
        # The team's own upstream may not take a name it already sees from the shared one: refused at sync.
        with demo_upstream("mirror", team=ops) as own:
            rejected = Upstream.objects.get(pk=own.pk).last_sync_error
            kept = set(own.tools.values_list("name", flat=True))

    assert "mirror__echo" in listed and not {name for name in listed if name.startswith("demo__")}
    assert answered.content[0].text == "by my name"
    found = {tool["name"]: tool["call"] for tool in searched.structured_content["tools"]}
    assert found.get("mirror__echo") == "tools.mirror.echo" and "demo__echo" not in found  # code mode names it so too
    assert "from code" in coded.content[0].text
    assert isinstance(old_name, MCPError) and old_name.data["code"] == "TOOL_NOT_FOUND"
    assert "demo__echo" in owners and not {name for name in owners if name.startswith("mirror__")}
    assert "'echo': team 'ops' already sees 'mirror__echo' from upstream 'demo'" in rejected
    assert "echo" not in kept


DOCUMENT = "all+demo://resource/static/document/architecture.md"


def test_a_borrower_reads_resources_and_gets_prompts_under_its_local_prefix(inline_gateway, world, ops):
    every = Upstream.objects.get(slug="every")
    every.shared_with.add(ops)
    local_prefix_set(upstream=every, team=ops, prefix="all", actor="olga")

    updates: list[str] = []
    heard = anyio.Event()

    async def on_message(message) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(str(message.params.uri))
            heard.set()

    async def scenario(key: str):
        async with sdk_client(inline_gateway.url, key, "legacy", message_handler=on_message) as client:
            resources = await client.list_resources(cache_mode="bypass")
            prompts = await client.list_prompts(cache_mode="bypass")
            read = await client.read_resource(DOCUMENT)
            await client.subscribe_resource(DOCUMENT)
            await client.call_tool("all__toggle-subscriber-updates", {})  # server-everything: every 5 s
            try:
                with anyio.fail_after(10):
                    await heard.wait()
            finally:
                await client.call_tool("all__toggle-subscriber-updates", {})  # off again
            return {r.uri for r in resources.resources}, {p.name for p in prompts.prompts}, read

    try:
        with agent("ops-reader", team=ops) as (_, key):
            eventually(lambda: "all__echo" in run(lambda: tool_names(inline_gateway.url, key)), timeout=10)
            uris, prompts, read = run(lambda: scenario(key))
    finally:
        every.shared_with.remove(ops)

    assert "all+demo://resource/static/document/architecture.md" in uris
    assert not {uri for uri in uris if uri.startswith("every+")}
    assert "all__simple-prompt" in prompts and not {name for name in prompts if name.startswith("every__")}
    assert [c.uri for c in read.contents] == [DOCUMENT]
    assert set(updates) == {DOCUMENT}  # its updates come under the name it subscribed by
