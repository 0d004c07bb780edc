"""An example specialist MCP server, guarded by `require_gateway_clearance`: it answers only requests that
carry a delegation token from the gateway, and its tools read the state the handoff carried over.

    SWITCHBOARD_DELEGATION_KEYS=k1:... SWITCHBOARD_URL=http://127.0.0.1:8000 \\
        python examples/specialist_server.py finance 9101

Register it as an upstream whose slug is the first argument (`http://127.0.0.1:9101/mcp`, marked
internal and handoff-only), and add a handoff route to it. SWITCHBOARD_DELEGATION_KEYS must be the
gateway's GATEWAY_DELEGATION_KEYS; SWITCHBOARD_URL is where large carried state is redeemed.
"""

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for `handoff.clearance`, run from anywhere

from mcp import types  # noqa: E402
from mcp.server import Server  # noqa: E402

from handoff.clearance import clearance_of, require_gateway_clearance  # noqa: E402

OBJECT = {"type": "object", "properties": {}}


def build_server(domain: str) -> Server:
    tools = [
        types.Tool(
            name="handoff_context",
            description=f"What the gateway told the {domain} specialist about this handoff.",
            input_schema=OBJECT,
        ),
        types.Tool(
            name="ask",
            description=f"Ask the {domain} specialist a question.",
            input_schema={"type": "object", "properties": {"question": {"type": "string"}}, "required": ["question"]},
        ),
        types.Tool(
            name="return_to_triage",
            description="Write the summary the gateway hands back to triage.",
            input_schema={"type": "object", "properties": {"note": {"type": "string"}}},
        ),
    ]

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        clearance = clearance_of(ctx.request)
        arguments = params.arguments or {}
        if params.name == "handoff_context":
            context = {
                "domain": clearance.domain,
                "reason": clearance.reason,
                "state": clearance.state,
                "token_id": clearance.token_id,
                "traceparent": clearance.traceparent,
            }
            text = json.dumps(context)
        elif params.name == "ask":
            text = f"The {domain} specialist's answer to {arguments.get('question', '')!r}."
        else:
            text = f"{domain} specialist summary: {arguments.get('note', 'nothing to report')}"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    return Server(f"{domain}-specialist", on_list_tools=list_tools, on_call_tool=call_tool)


def main() -> None:
    import uvicorn

    domain, port = sys.argv[1], int(sys.argv[2])
    app = require_gateway_clearance(
        build_server(domain).streamable_http_app(),
        keys=os.environ["SWITCHBOARD_DELEGATION_KEYS"],
        audience=domain,
        gateway_url=os.environ.get("SWITCHBOARD_URL", ""),
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
