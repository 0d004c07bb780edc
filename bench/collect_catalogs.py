"""Collect real MCP servers' tool catalogs for the tool-search evaluation (bench/search_eval.py).

Run by hand, not in CI: it needs the servers installed (npm: `npm install --ignore-scripts PACKAGE@VERSION`
in DIR; PyPI: in this venv). Each server is started over stdio with placeholder credentials, listed with the
official SDK client (every page), and written to bench/catalogs/<name>.json with the package it came from.

    .venv/bin/python bench/collect_catalogs.py --npm-dir /tmp/cat --npm-dir /tmp/cat2 --bin-dir /tmp/atl/bin
"""

import argparse
import asyncio
import json
import shutil
import sys
from pathlib import Path

from mcp import Client, StdioServerParameters

OUT = Path(__file__).parent / "catalogs"
PLACEHOLDERS = {
    "GITHUB_PERSONAL_ACCESS_TOKEN": "placeholder",
    "GITLAB_PERSONAL_ACCESS_TOKEN": "placeholder",
    "SLACK_BOT_TOKEN": "placeholder",
    "SLACK_TEAM_ID": "placeholder",
    "GOOGLE_MAPS_API_KEY": "placeholder",
    "BRAVE_API_KEY": "placeholder",
    "FIRECRAWL_API_KEY": "placeholder",
    "EXA_API_KEY": "placeholder",
    "HEROKU_API_KEY": "placeholder",
    "SENTRY_ACCESS_TOKEN": "placeholder",
    "SUPABASE_ACCESS_TOKEN": "placeholder",
    "NOTION_TOKEN": "placeholder",
    "CIRCLECI_TOKEN": "placeholder",
    "PRIVATE_APP_ACCESS_TOKEN": "placeholder",
    "EVERART_API_KEY": "placeholder",
    "AWS_ACCESS_KEY_ID": "placeholder",
    "AWS_SECRET_ACCESS_KEY": "placeholder",
    "AWS_REGION": "us-east-1",
    "JIRA_URL": "https://placeholder.atlassian.net",
    "JIRA_USERNAME": "placeholder",
    "JIRA_API_TOKEN": "placeholder",
    "CONFLUENCE_URL": "https://placeholder.atlassian.net/wiki",
    "CONFLUENCE_USERNAME": "placeholder",
    "CONFLUENCE_API_TOKEN": "placeholder",
}
# name -> (package@version, command relative to the npm dir's node_modules/.bin, arguments)
NPM = {
    "filesystem": ("@modelcontextprotocol/server-filesystem@2026.8.31", "mcp-server-filesystem", ["/tmp"]),
    "memory": ("@modelcontextprotocol/server-memory@2026.8.31", "mcp-server-memory", []),
    "github": ("@modelcontextprotocol/server-github@2025.4.8", "mcp-server-github", []),
    "thinking": (
        "@modelcontextprotocol/server-sequential-thinking@2026.8.31",
        "mcp-server-sequential-thinking",
        [],
    ),
    "puppeteer": ("@modelcontextprotocol/server-puppeteer@2025.5.12", "mcp-server-puppeteer", []),
    "slack": ("@modelcontextprotocol/server-slack@2025.4.25", "mcp-server-slack", []),
    "gitlab": ("@modelcontextprotocol/server-gitlab@2025.4.25", "mcp-server-gitlab", []),
    "maps": ("@modelcontextprotocol/server-google-maps@0.6.2", "mcp-server-google-maps", []),
    "brave": ("@modelcontextprotocol/server-brave-search@0.6.2", "mcp-server-brave-search", []),
    "postgres": ("@modelcontextprotocol/server-postgres@0.6.2", "mcp-server-postgres", ["postgres://localhost/x"]),
    "playwright": ("@playwright/mcp@0.0.83", "playwright-mcp", []),
    "notion": ("@notionhq/notion-mcp-server@2.5.2", "notion-mcp-server", []),
    "sentry": ("@sentry/mcp-server@0.39.0", "sentry-mcp", ["--access-token", "placeholder"]),
    "firecrawl": ("firecrawl-mcp@3.26.0", "firecrawl-mcp", []),
    "context7": ("@upstash/context7-mcp@4.1.1", "context7-mcp", []),
    "exa": ("exa-mcp-server@3.4.1", "exa-mcp-server", []),
    "kubernetes": ("mcp-server-kubernetes@4.1.7", "mcp-server-kubernetes", []),
    "everything": ("@modelcontextprotocol/server-everything@2026.8.31", "mcp-server-everything", ["stdio"]),
    "mongodb": ("mongodb-mcp-server@3.0.4", "mongodb-mcp-server", []),
    "circleci": ("@circleci/mcp-server-circleci@0.20.0", "mcp-server-circleci", []),
    "hubspot": ("@hubspot/mcp-server@0.4.0", "mcp-hubspot", []),
    "aws-kb": ("@modelcontextprotocol/server-aws-kb-retrieval@0.6.2", "mcp-server-aws-kb-retrieval", []),
    "everart": ("@modelcontextprotocol/server-everart@0.6.2", "mcp-server-everart", []),
}
PYPI = {
    "time": ("mcp-server-time", ["--local-timezone", "UTC"]),
    "git": ("mcp-server-git", []),
    "fetch": ("mcp-server-fetch", []),
    "atlassian": ("mcp-atlassian", []),  # in a venv of its own (its mcp is 1.x): --bin-dir
}


async def catalog(command: str, args: list[str]) -> list[dict]:
    params = StdioServerParameters(command=command, args=args, env=PLACEHOLDERS | {"PATH": "/usr/bin:/bin"})
    async with asyncio.timeout(60), Client(params, mode="legacy") as client:
        tools, cursor = [], None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools += [tool.model_dump(by_alias=True, exclude_none=True, mode="json") for tool in page.tools]
            if not (cursor := page.next_cursor):
                return tools


def _servers(npm_dirs: list[Path], bin_dirs: list[Path]) -> dict[str, tuple[str, str, list[str]]]:
    servers = {}
    for name, (package, binary, args) in NPM.items():
        found = [d / "node_modules/.bin" / binary for d in npm_dirs if (d / "node_modules/.bin" / binary).exists()]
        if found:
            servers[name] = (package, str(found[0]), args)
    path = ":".join(str(d) for d in [Path(sys.executable).parent, *bin_dirs])
    for name, (package, args) in PYPI.items():
        if command := shutil.which(package, path=path):
            servers[name] = (package, command, args)
    return servers


async def collect(npm_dirs: list[Path], bin_dirs: list[Path]) -> None:
    for name, (package, command, args) in _servers(npm_dirs, bin_dirs).items():
        try:
            tools = await catalog(command, args)
        except Exception as exc:  # a server that will not start without real credentials is left out
            print(f"{name}: skipped ({exc!r})")
            continue
        (OUT / f"{name}.json").write_text(json.dumps({"package": package, "tools": tools}, indent=1) + "\n")
        print(f"{name}: {len(tools)} tools")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npm-dir", type=Path, action="append", default=[], help="where npm installed servers")
    parser.add_argument("--bin-dir", type=Path, action="append", default=[], help="more places for PyPI servers")
    arguments = parser.parse_args()
    asyncio.run(collect(arguments.npm_dir, arguments.bin_dir))
