"""One tool call through Switchboard with the official MCP Python SDK: the README's "Connecting a client".

    .venv/bin/python examples/client.py [URL]

URL is the gateway's MCP endpoint, http://127.0.0.1:8000/mcp by default (where scripts/demo serves). The agent's
API key comes from SWITCHBOARD_KEY, else from the demo agent's, which scripts/demo keeps in var/demo_key."""

import asyncio
import os
import sys
from pathlib import Path

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

# Where scripts/demo keeps the demo agent's key (SWITCHBOARD_VAR_DIR moves it, as it moves the whole var/).
VAR_DIR = Path(os.environ.get("SWITCHBOARD_VAR_DIR") or Path(__file__).resolve().parent.parent / "var")


def api_key() -> str:
    if key := os.environ.get("SWITCHBOARD_KEY"):
        return key
    try:
        return (VAR_DIR / "demo_key").read_text().strip()
    except FileNotFoundError:
        sys.exit(f"No API key: set SWITCHBOARD_KEY, or run scripts/demo once (it writes {VAR_DIR / 'demo_key'}).")


def first(group: BaseExceptionGroup) -> BaseException:
    """The first error of a group: the SDK's task groups nest the one that ended the session."""
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group


async def main(url: str, key: str) -> None:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            result = await client.call_tool("time__get_current_time", {"timezone": "Europe/Paris"})
    print(*(part.text for part in result.content if part.type == "text"), sep="\n")


if __name__ == "__main__":
    url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/mcp"
    try:
        asyncio.run(main(url, api_key()))
    except* httpx2.ConnectError:
        sys.exit(f"Nothing answers at {url}: start the gateway first (scripts/demo).")
    except* MCPError as refused:  # the gateway's answer: a wrong key, a tool this agent may not call
        sys.exit(f"The gateway refused: {first(refused)}")
