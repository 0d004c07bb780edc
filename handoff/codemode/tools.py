"""The gateway's code-mode tools as agents see them: `search_tools` finds tools with their TypeScript
signatures, `execute` runs code that calls them (handoff/codemode/run.py runs both)."""

from typing import Any

from django.conf import settings

from registry.naming import gateway_tool_name

SEARCH_TOOLS, EXECUTE = "search_tools", "execute"


def search_tools_definition() -> dict[str, Any]:
    most = settings.GATEWAY_SEARCH_MAX_RESULTS
    return {
        "name": gateway_tool_name(SEARCH_TOOLS),
        "title": "Search tools",
        "description": (
            "Find the tools you may use for a task, best match first, each with its TypeScript signature. "
            f"Call them from {gateway_tool_name(EXECUTE)} as `await tools.<namespace>.<method>(args)`, or "
            "directly by their name."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What you want to do, in a few words"},
                "k": {"type": "integer", "minimum": 1, "maximum": most, "description": "How many tools (5)"},
            },
            "required": ["query"],
        },
        "annotations": {"readOnlyHint": True, "openWorldHint": False},
    }


def execute_definition() -> dict[str, Any]:
    return {
        "name": gateway_tool_name(EXECUTE),
        "title": "Run code that calls tools",
        "description": (
            "Run TypeScript in a sandbox. The code is the body of an async function; every tool you may use "
            "is an async function `tools.<namespace>.<method>(args)` (find them, with signatures, with "
            f"{gateway_tool_name(SEARCH_TOOLS)}), resolving to the tool's structured result, or its text "
            "(parsed when it is JSON). A failed call throws `MCPToolError` (`.code`, `.tool`, `.message`), "
            "which the code may catch. Only what the code returns (JSON) and its console output come back. "
            "No network, files, environment or subprocesses; time, memory, output and the number of calls "
            "are capped."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "TypeScript: the body of an async function"}},
            "required": ["code"],
        },
    }
