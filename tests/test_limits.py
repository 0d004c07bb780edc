"""Limits: calls a minute per agent and per upstream (exact under concurrency), calls per session, calls at
once per upstream. Each refusal is -32003 (or -32001 for the session cap) with its code, `retryAfter` where
waiting helps, and a `denied` audit row; nothing refused reaches the upstream."""

import uuid

import anyio
import httpx2
from mcp.shared.exceptions import MCPError

from registry.models import Upstream
from tests import servers
from tests.clients import call, refused_socket, sdk_client, tool_names
from tests.factories import agent, demo_upstream, team
from tests.helpers import audit_mark, audit_since, eventually, run, until


def burst(gateway, key: str, name: str, arguments: dict, count: int) -> list:
    """`count` calls at once, each in a session of its own."""

    async def scenario() -> list:
        results: list = []

        async def one() -> None:
            results.append(await call(gateway.url, key, name, arguments))

        async with anyio.create_task_group() as tg:
            for _ in range(count):
                tg.start_soon(one)
        return results

    return run(scenario)


def refusals(results: list) -> list[MCPError]:
    return [r for r in results if isinstance(r, MCPError)]


def wait_until_offered(gateway, key: str, name: str) -> None:
    eventually(lambda: name in run(lambda: tool_names(gateway.url, key)))


def test_an_agents_rate_limit_admits_exactly_its_calls_per_minute_under_concurrency(gateway, world):
    with agent("frank", calls_per_minute=5) as (_, key):
        wait_until_offered(gateway, key, "demo__echo")
        mark = audit_mark()
        results = burst(gateway, key, "demo__echo", {"text": "hi"}, 8)
    refused = refusals(results)
    assert len(refused) == 3 and len(results) - len(refused) == 5
    for error in refused:
        assert (error.code, error.data["code"]) == (-32003, "AGENT_RATE_LIMITED")
        assert 0 < error.data["retryAfter"] <= 60
        assert str(error).startswith("This agent may make 5 tool calls a minute. Retry after ")
    rows = audit_since(mark)
    assert sorted(r.error_code for r in rows if r.kind == "denied") == ["AGENT_RATE_LIMITED"] * 3
    assert len([r for r in rows if r.kind == "approved"]) == len([r for r in rows if r.kind == "completed"]) == 5


def test_a_team_over_its_calls_per_minute_is_refused_across_its_agents_with_the_code_naming_it(gateway, world):
    """Three calls a minute for the team, whose two agents may each make many: the team's limit holds them (the demo
    upstream is the default team's, lent to this one)."""
    with team("sales", calls_per_minute=3) as sales, agent("sue", team=sales) as (_, sue):
        Upstream.objects.get(slug="demo").shared_with.add(sales)  # deleted with the team
        with agent("sam", team=sales) as (_, sam):
            wait_until_offered(gateway, sam, "demo__echo")
            mark = audit_mark()
            results = burst(gateway, sue, "demo__echo", {"text": "hi"}, 2)
            results += burst(gateway, sam, "demo__echo", {"text": "hi"}, 3)
    refused = refusals(results)
    assert len(refused) == 2 and len(results) - len(refused) == 3
    for error in refused:
        assert (error.code, error.data["code"]) == (-32003, "TEAM_RATE_LIMITED")
        assert 0 < error.data["retryAfter"] <= 60
        assert str(error).startswith(
            "Team 'sales' may make 3 tool calls a minute, all its agents together. Retry after "
        )
    rows = audit_since(mark)
    assert sorted((r.error_code, r.team) for r in rows if r.kind == "denied") == [("TEAM_RATE_LIMITED", "sales")] * 2


def test_a_borrower_saturating_a_shared_upstream_is_refused_past_its_share_while_the_owner_still_gets_calls(
    inline_gateway, world
):
    """An upstream of four calls at once lent to another team: the borrower runs two, its third is refused
    naming the upstream, and the owner's call still runs."""
    url = inline_gateway.url
    with team("lender") as lender, team("borrower") as borrower:
        with demo_upstream("lent", max_concurrent=4, team=lender) as lent:
            lent.shared_with.add(borrower)
            with agent("lender-bot", team=lender) as (_, owner), agent("borrower-bot", team=borrower) as (_, guest):
                wait_until_offered(inline_gateway, guest, "lent__sleep")
                wait_until_offered(inline_gateway, owner, "lent__echo")
                marks = [f"share-{uuid.uuid4().hex}" for _ in range(2)]

                async def scenario() -> tuple:
                    async with anyio.create_task_group() as tg:
                        for mark in marks:
                            tg.start_soon(call, url, guest, "lent__sleep", {"seconds": 2, "mark": mark})
                        await until(lambda: all(servers.demo_started(m) for m in marks))
                        refused = await call(url, guest, "lent__echo", {"text": "one more"})
                        served = await call(url, owner, "lent__echo", {"text": "mine"})
                    return refused, served

                refused, served = run(scenario)
    assert (refused.code, refused.data["code"], refused.data["retryAfter"]) == (-32003, "UPSTREAM_SHARE_BUSY", 1.0)
    assert str(refused) == (
        "The service 'lent' is shared with team 'borrower', which may run 2 of its calls at once and is running "
        "them. Retry after 1 second."
    )
    assert served.content[0].text == "mine"


def test_an_upstreams_rate_limit_counts_every_agents_calls(inline_gateway, world):
    with demo_upstream("metered", calls_per_minute=3):
        wait_until_offered(inline_gateway, world.key, "metered__echo")
        results = burst(inline_gateway, world.key, "metered__echo", {"text": "hi"}, 5)
    refused = refusals(results)
    assert [(e.code, e.data["code"]) for e in refused] == [(-32003, "UPSTREAM_RATE_LIMITED")] * 2
    assert "The service 'metered' takes 3 calls a minute. Retry after " in str(refused[0])


def test_a_session_may_make_only_its_maximum_of_calls_and_a_new_session_starts_afresh(inline_gateway, world):
    with agent("grace", max_calls_per_session=2) as (_, key):
        wait_until_offered(inline_gateway, key, "demo__echo")

        async def one_session() -> list:
            async with sdk_client(inline_gateway.url, key, "legacy") as client:
                outcomes = []
                for _ in range(3):
                    try:
                        outcomes.append((await client.call_tool("demo__echo", {"text": "x"})).is_error)
                    except MCPError as refused:
                        outcomes.append((refused.code, refused.data["code"], str(refused)))
                return outcomes

        first, second = run(one_session), run(one_session)
    message = "This session has made the 2 tool calls it may make. Start a new session."
    expected = [False, False, (-32001, "SESSION_CALL_LIMIT", message)]
    assert first == second == expected


def test_a_stateless_key_gets_its_session_cap_per_window_and_a_busy_key_gets_out_when_it_ends(
    short_window_gateway, world
):
    """2026-07-28 requests have no session to start afresh: the cap counts per key over a fixed window (5 s
    here), which refused calls made meanwhile do not extend."""
    url = short_window_gateway.url
    with agent("ivan", max_calls_per_session=2) as (_, key):
        eventually(lambda: "demo__echo" in run(lambda: tool_names(url, key, "2026-07-28")))

        async def until_admitted() -> tuple[list, list]:
            outcomes = [await call(url, key, "demo__echo", {"text": "x"}, mode="2026-07-28") for _ in range(3)]
            refused = []
            with anyio.fail_after(12):
                while isinstance(
                    outcome := await call(url, key, "demo__echo", {"text": "y"}, mode="2026-07-28"), MCPError
                ):
                    refused.append(outcome)
            return outcomes, [*refused, outcome]

        (first, second, third), later = run(until_admitted)
    assert (first.is_error, second.is_error) == (False, False)
    assert (third.code, third.data["code"]) == (-32003, "KEY_CALL_LIMIT")
    assert 0 < third.data["retryAfter"] <= 5
    assert str(third).startswith(
        "Stateless requests with this API key may make 2 tool calls in 5 seconds, and have made them. Retry after "
    )
    assert later[-1].content[0].text == "y", "the key is served again once its window ends"


def test_calls_past_an_upstreams_concurrency_are_refused_as_busy(inline_gateway, world):
    with demo_upstream("narrow", max_concurrent=1):
        wait_until_offered(inline_gateway, world.key, "narrow__sleep")
        mark = audit_mark()
        results = burst(inline_gateway, world.key, "narrow__sleep", {"seconds": 2}, 2)
        after = run(lambda: call(inline_gateway.url, world.key, "narrow__echo", {"text": "free again"}))
    [refused] = refusals(results)
    assert (refused.code, refused.data["code"], refused.data["retryAfter"]) == (-32003, "UPSTREAM_BUSY", 1.0)
    assert "is running its maximum of 1 calls at once" in str(refused)
    assert after.content[0].text == "free again", "the slot was given back"
    assert [r.error_code for r in audit_since(mark) if r.kind == "denied"] == ["UPSTREAM_BUSY"]


def test_without_its_shared_state_the_gateway_refuses_calls_rather_than_run_them_unchecked(server_env, world, logs):
    """Redis gone (here: a port where nothing listens): requests are refused, audited, and the process serves on.
    The first shared state a 2025-11-25 request reads is its session's record, and a 2026-07-28 call's is its
    session's handoff state (is it handed off?), so that is what is missing."""
    env = server_env | {"GATEWAY_EXECUTOR": "inline", "REDIS_URL": f"redis://127.0.0.1:{servers.free_port()}/0"}
    gateway = servers.start_gateway(env, logs / "gateway-no-redis.log")
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    headers = {"authorization": f"Bearer {world.key}", "accept": "application/json, text/event-stream"}
    try:
        mark = audit_mark()
        opening = [httpx2.post(f"{gateway.url}/mcp", json=init, headers=headers, timeout=30) for _ in range(2)]
        refused = run(lambda: call(gateway.url, world.key, "demo__echo", {"text": "x"}, "2026-07-28"))
        socket, code = run(lambda: refused_socket(gateway.url, world.key))
    finally:
        gateway.stop()
    for answer in opening:
        assert (answer.status_code, answer.headers["retry-after"]) == (503, "1")
        assert answer.json()["error"] == {
            "code": -32003,
            "message": "The gateway cannot read this session's state right now, so the request was not served. "
            "Retry after 1 second.",
            "data": {"code": "SESSION_STATE_UNAVAILABLE", "retryAfter": 1.0},
        }
    assert (refused.code, refused.data["code"], refused.data["retryAfter"]) == (
        -32003,
        "SESSION_STATE_UNAVAILABLE",
        1.0,
    )
    assert str(refused) == (
        "The gateway cannot read this session's state right now, so 'demo__echo' was not run. Retry after 1 second."
    )
    assert code == 4503 and socket == {"jsonrpc": "2.0", "id": None, "error": opening[0].json()["error"]}
    rows = audit_since(mark)
    assert [(r.kind, r.error_code) for r in rows] == [("denied", "SESSION_STATE_UNAVAILABLE")] * 4
    assert [r.detail.get("method") for r in rows[:2]] == ["initialize", "initialize"]
    assert rows[3].transport == "ws"
