"""What an upstream asks of the client when it asks the push way (on the call's stream), and the tools it offers
only to clients that declare a capability: through the real gateway, with the SDK client, in both eras."""

import uuid

import pytest
from mcp import types
from mcp.shared.exceptions import MCPError

from registry.models import Upstream
from tests.clients import sdk_client, tool_names
from tests.factories import demo_upstream
from tests.helpers import eventually, run

MODES = ["legacy", "2026-07-28"]
GATED = {"every__trigger-sampling-request", "every__trigger-elicitation-request", "every__trigger-url-elicitation"}


async def _sampled(context, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    prompt = params.messages[0].content.text
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text=f"echo of {prompt}"), model="test-model"
    )


async def _elicited(context, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"answer": f"yes to {params.message}"})


@pytest.fixture(scope="module")
def pushing(world, inline_gateway):
    """The demo server (it speaks both eras) asking on the call's stream whatever the era, as SDK servers that
    call `ctx.session.create_message` or `ctx.elicit` do."""
    slug = f"push-{uuid.uuid4().hex[:8]}"
    with demo_upstream(slug, env={"DEMO_PUSH": "1"}) as upstream:
        eventually(lambda: f"{slug}__ask" in run(lambda: tool_names(inline_gateway.url, world.key)))
        yield upstream


@pytest.mark.parametrize("of", ["sampling", "elicitation"])
def test_a_legacy_agent_answers_what_a_dual_era_upstream_asks_on_the_calls_stream(gateway, world, pushing, of):
    async def scenario():
        async with sdk_client(
            gateway.url, world.key, "legacy", sampling_callback=_sampled, elicitation_callback=_elicited
        ) as client:
            return await client.call_tool(f"{pushing.slug}__ask", {"question": "Say hi", "of": of})

    result = run(scenario)
    said = "the model said: echo of Say hi" if of == "sampling" else 'accept: {"answer": "yes to Say hi"}'
    assert (result.is_error, result.content[0].text) == (False, said)


def test_an_upstream_that_spoke_only_2025_11_25_at_its_last_sync_still_gets_each_agents_era(inline_gateway, world):
    slug = f"upgraded-{uuid.uuid4().hex[:8]}"
    with demo_upstream(slug, env={"DEMO_PUSH": "1"}) as upstream:
        Upstream.objects.filter(pk=upstream.pk).update(protocol_version="2025-11-25")  # the era the gateway guesses
        eventually(lambda: f"{slug}__ask" in run(lambda: tool_names(inline_gateway.url, world.key)))

        async def scenario():
            async with sdk_client(inline_gateway.url, world.key, "legacy", sampling_callback=_sampled) as client:
                sampled = await client.call_tool(f"{slug}__ask", {"question": "Say hi", "of": "sampling"})
            async with sdk_client(inline_gateway.url, world.key, "2026-07-28") as client:
                try:
                    await client.call_tool(f"{slug}__needs_sampling", {})
                except MCPError as refused:
                    return sampled, refused.error

        sampled, refused = run(scenario)
    assert sampled.content[0].text == "the model said: echo of Say hi"
    # At 2026-07-28 its requests carry the agent's capabilities, not all those a 2025-11-25 session declares.
    assert (refused.code, refused.data) == (-32021, {"requiredCapabilities": {"sampling": {}}})


@pytest.mark.parametrize("mode", MODES)
def test_tools_an_upstream_offers_only_to_clients_declaring_capabilities_are_listed(inline_gateway, world, mode):
    assert GATED <= run(lambda: tool_names(inline_gateway.url, world.key, mode))


@pytest.mark.parametrize("mode", MODES)
def test_server_everythings_sampling_request_reaches_an_agent_that_declared_sampling(gateway, world, mode):
    async def scenario():
        async with sdk_client(gateway.url, world.key, mode, sampling_callback=_sampled) as client:
            return await client.call_tool("every__trigger-sampling-request", {"prompt": "Say hi"})

    result = run(scenario)
    assert not result.is_error
    assert '"text": "echo of Resource trigger-sampling-request context: Say hi"' in result.content[0].text


@pytest.mark.parametrize("mode", MODES)
def test_an_agent_that_did_not_declare_sampling_is_told_so_when_the_upstream_asks(gateway, world, mode):
    async def scenario():
        async with sdk_client(gateway.url, world.key, mode, elicitation_callback=_elicited) as client:
            with_elicitation = await client.call_tool("every__trigger-sampling-request", {"prompt": "Say hi"})
        async with sdk_client(gateway.url, world.key, mode) as client:  # on the shared connection
            with_nothing = await client.call_tool("every__trigger-sampling-request", {"prompt": "Say hi"})
        return with_elicitation, with_nothing

    for result in run(scenario):  # the gateway refused the upstream's request; server-everything says why
        assert (result.is_error, result.content[0].text) == (
            True,
            "MCP error -32601: The client did not declare the capability for sampling/createMessage.",
        )
