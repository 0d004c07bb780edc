"""The agent's end of a relayed call (registry/relay.py): progress goes out on the call's own stream,
and an upstream's request to the client goes to the agent only if it declared the capability for it."""

from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.shared.message import ServerMessageMetadata

from registry.relay import ASKS, RELAYED_CAPABILITIES, may_ask, unsupported


def declared(ctx: ServerRequestContext) -> frozenset[str]:
    capabilities = ctx.session.client_capabilities
    return frozenset(name for name in RELAYED_CAPABILITIES if capabilities and getattr(capabilities, name, None))


class AgentRelay:
    def __init__(self, ctx: ServerRequestContext) -> None:
        self.ctx = ctx
        self.capabilities = declared(ctx)

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        await self.ctx.session.report_progress(progress, total, message)  # a no-op unless the agent asked

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if not may_ask(method, self.capabilities):
            raise unsupported(method)
        ask = ASKS[method]
        request = ask.request.model_validate({"method": method, "params": params})
        related = ServerMessageMetadata(related_request_id=self.ctx.request_id)  # on the call's own stream
        result = await self.ctx.session.send_request(request, ask.result, metadata=related)
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)
