"""Resources, resource templates, prompts and completions through the gateway: aggregated, namespaced,
filtered by rules and audited, in both eras, through both executors. server-everything (npm) is the upstream
`every`; mcp-server-time (`time`) offers none of these and must simply not show."""

import base64

import anyio
import pytest
from mcp import types
from mcp.shared.exceptions import MCPError

from audit.models import AuditEvent
from policy.models import Rule
from policy.services import policy_object_delete, policy_object_save
from registry.models import Upstream
from tests.clients import sdk_client
from tests.helpers import audit_mark, audit_since, eventually, run

MODES = ["legacy", "2026-07-28"]
DOCUMENT = "every+demo://resource/static/document/architecture.md"


async def _every_page(list_page, key: str) -> list:
    items, cursor = [], None
    while True:
        page = await list_page(cursor=cursor)
        items += getattr(page, key)
        if not (cursor := page.next_cursor):
            return items


@pytest.mark.parametrize("mode", MODES)
def test_resources_templates_and_prompts_are_listed_under_the_upstreams_namespace(gateway, world, mode):
    async def scenario():
        async with sdk_client(gateway.url, world.key, mode) as client:
            resources = await client.list_resources(cache_mode="bypass")
            templates = await client.list_resource_templates(cache_mode="bypass")
            prompts = await client.list_prompts(cache_mode="bypass")
            return client.server_capabilities, resources, templates, prompts

    capabilities, resources, templates, prompts = run(scenario)
    if mode == "legacy":  # a 2026-07-28 client learns them only if it asks (server/discover)
        assert capabilities.resources and capabilities.prompts and capabilities.completions
    assert DOCUMENT in {r.uri for r in resources.resources}
    assert {t.uri_template for t in templates.resource_templates} == {
        "every+demo://resource/dynamic/text/{resourceId}",
        "every+demo://resource/dynamic/blob/{resourceId}",
    }
    assert {p.name for p in prompts.prompts} == {
        "every__simple-prompt",
        "every__args-prompt",
        "every__completable-prompt",
        "every__resource-prompt",
    }
    if mode != "legacy":  # per-agent lists: private, never fresh
        assert (prompts.cache_scope, prompts.ttl_ms) == ("private", 0)


@pytest.mark.parametrize("mode", MODES)
def test_a_resource_is_read_by_its_exposed_uri_and_comes_back_under_it(gateway, world, mode):
    mark = audit_mark()

    async def scenario():
        async with sdk_client(gateway.url, world.key, mode) as client:
            text = await client.read_resource(DOCUMENT)
            blob = await client.read_resource("every+demo://resource/dynamic/blob/7")
            return text, blob

    text, blob = run(scenario)
    assert [c.uri for c in text.contents] == [DOCUMENT] and "Architecture" in text.contents[0].text
    assert blob.contents[0].uri == "every+demo://resource/dynamic/blob/7"
    assert base64.b64decode(blob.contents[0].blob)
    # The upstream's identity stays behind: a 2026-07-28 result names the gateway alone.
    assert (text.meta or {}).get("io.modelcontextprotocol/serverInfo", {"name": "switchboard"})["name"] == "switchboard"
    rows = [(r.kind, r.upstream, r.tool, r.exposed_name, r.outcome) for r in audit_since(mark) if r.upstream]
    assert rows[:2] == [
        ("approved", "every", DOCUMENT.removeprefix("every+"), DOCUMENT, ""),
        ("completed", "every", DOCUMENT.removeprefix("every+"), DOCUMENT, "ok"),
    ]
    assert len(rows) == 4 and audit_since(mark)[0].detail["method"] == "resources/read"


@pytest.mark.parametrize("mode", MODES)
def test_prompts_are_got_and_completed_by_their_exposed_names(gateway, world, mode):
    async def scenario():
        async with sdk_client(gateway.url, world.key, mode) as client:
            prompt = await client.get_prompt("every__args-prompt", {"city": "Lyon"})
            completion = await client.complete(
                types.PromptReference(type="ref/prompt", name="every__completable-prompt"),
                {"name": "department", "value": "Eng"},
            )
            return prompt, completion

    prompt, completion = run(scenario)
    assert "Lyon" in prompt.messages[0].content.text
    assert completion.completion.values == ["Engineering"]


@pytest.mark.parametrize("mode", MODES)
def test_unknown_resources_and_prompts_get_a_specific_error_and_an_audit_row(inline_gateway, world, mode):
    mark = audit_mark()

    async def scenario():
        refusals = []
        async with sdk_client(inline_gateway.url, world.key, mode) as client:
            for attempt in (
                lambda: client.read_resource("nowhere+demo://x"),
                lambda: client.get_prompt("every__no-such-prompt"),
                lambda: client.read_resource("every+demo://resource/static/document/missing.md"),
            ):
                with pytest.raises(MCPError) as refused:
                    await attempt()
                refusals.append((refused.value.error.code, refused.value.error.message))
        return refusals

    unknown_upstream, unknown_prompt, unknown_document = run(scenario)
    # No unprefixed upstream exists here, so an unknown prefix has no owner at all.
    assert unknown_upstream == (
        types.INVALID_PARAMS,
        "Unknown resource: 'nowhere+demo://x'. Call resources/list for what this gateway offers.",
    )
    # The upstream's own refusals keep its JSON-RPC code, behind the gateway's words.
    assert unknown_prompt[0] == types.INVALID_PARAMS and "no-such-prompt" in unknown_prompt[1]
    assert unknown_document[1].startswith("The service refused the request:")
    kinds = [(r.kind, r.error_code) for r in audit_since(mark) if r.kind != AuditEvent.Kind.SESSION]
    assert kinds[0] == ("denied", "NOT_FOUND") and ("completed", "UPSTREAM_ERROR") in kinds


def test_rules_hide_and_refuse_resources_and_prompts_like_tools(inline_gateway, world):
    every = Upstream.objects.get(slug="every")
    rule = Rule(effect=Rule.Effect.DENY, upstream=every, tool_pattern="*prompt")
    policy_object_save(obj=rule, actor="tests", created=True)
    try:

        async def prompts():
            async with sdk_client(inline_gateway.url, world.key, "legacy") as client:
                return {p.name for p in (await client.list_prompts(cache_mode="bypass")).prompts}

        assert eventually(lambda: not run(prompts))

        async def refused():
            async with sdk_client(inline_gateway.url, world.key, "legacy") as client:
                with pytest.raises(MCPError) as refusal:
                    await client.get_prompt("every__simple-prompt")
                return refusal.value.error

        error = run(refused)
        assert (error.code, error.data["code"]) == (-32001, "POLICY_DENIED")
    finally:
        policy_object_delete(obj=rule, actor="tests")


def test_long_lists_come_in_pages_with_opaque_cursors(server_env, world, logs):
    from tests.servers import inline_gateway_with

    with inline_gateway_with(server_env, logs / "paged.log", GATEWAY_LIST_PAGE_SIZE="3") as gateway:

        async def scenario():
            async with sdk_client(gateway.url, world.key, "2026-07-28") as client:
                first = await client.list_resources(cache_mode="bypass")
                every = await _every_page(lambda cursor: client.list_resources(cursor=cursor), "resources")
                tools = await _every_page(lambda cursor: client.list_tools(cursor=cursor), "tools")
                with pytest.raises(MCPError) as forged:
                    await client.list_tools(cursor="b2Zmc2V0OjM=")
                return first, every, tools, forged.value.error

        first, every, tools, forged = run(scenario)
        assert len(first.resources) == 3 and first.next_cursor and "every" not in first.next_cursor
        assert len(every) == 7 and len({r.uri for r in every}) == 7
        assert len(tools) > 20 and {"every__echo", "time__get_current_time"} <= {t.name for t in tools}
        assert (forged.code, forged.message) == (
            types.INVALID_PARAMS,
            "Invalid or expired cursor: call tools/list without a cursor to start from the first page.",
        )


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_the_gateways_instructions_include_the_upstreams_own(inline_gateway, world, mode):
    async def scenario():
        async with sdk_client(inline_gateway.url, world.key, mode) as client:
            return client.protocol_version, client.instructions, client.server_info

    version, instructions, info = run(scenario)
    assert version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
    assert instructions.startswith("This is a gateway to several services.")
    assert "## demo\nTools for trying a gateway out: echo and add answer at once" in instructions
    assert info.name == "switchboard"  # the upstreams' own serverInfo never shows


def test_sync_records_the_era_each_upstream_speaks(world):
    eras = dict(Upstream.objects.filter(slug__in=["demo", "every", "time"]).values_list("slug", "protocol_version"))
    # The demo server and mcp-server-time answer server/discover; server-everything only initialize.
    assert eras == {"demo": "2026-07-28", "every": "2025-11-25", "time": "2026-07-28"}


def test_a_subscribed_resource_s_updates_reach_the_subscriber_under_its_exposed_uri(gateway, world):
    updates: list[str] = []
    heard = anyio.Event()

    async def on_message(message) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(str(message.params.uri))
            heard.set()

    async def scenario():
        async with sdk_client(gateway.url, world.key, "legacy", message_handler=on_message) as client:
            assert client.server_capabilities.resources.subscribe
            await client.subscribe_resource(DOCUMENT)
            await client.call_tool("every__toggle-subscriber-updates", {})  # server-everything: every 5 s
            with anyio.fail_after(10):
                await heard.wait()
            await client.unsubscribe_resource(DOCUMENT)
            await client.call_tool("every__toggle-subscriber-updates", {})  # off again

    run(scenario)
    assert set(updates) == {DOCUMENT}


def test_a_2026_agent_hears_of_a_resource_it_names_on_its_listen_stream(gateway, world):
    async def scenario():
        async with sdk_client(gateway.url, world.key, "2026-07-28") as client:
            async with client.listen(resource_subscriptions=[DOCUMENT]) as subscription:
                await client.call_tool("every__toggle-subscriber-updates", {})  # server-everything: every 5 s
                try:
                    with anyio.fail_after(10):
                        async for event in subscription:
                            return event
                finally:
                    await client.call_tool("every__toggle-subscriber-updates", {})  # off again

    event = run(scenario)
    assert (type(event).__name__, event.uri) == ("ResourceUpdated", DOCUMENT)
