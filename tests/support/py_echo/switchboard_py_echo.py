"""A stdio MCP server with no dependencies, packed by tests/support/py_package.py as a wheel: its tool `version`
says the version it runs, the build's mark and the path of its module, so a test sees which install serves it."""

import json
import sys
from importlib import metadata

MARK = ""  # each build's own (tests/support/py_package.py)
TOOLS = [{"name": "version", "description": "Its version.", "inputSchema": {"type": "object"}}]


def answer(message: dict, result: dict) -> None:
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)


def main() -> None:
    version = metadata.version("switchboard-py-echo")
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue  # a notification
        method = message.get("method")
        if method == "initialize":
            info = {"name": "switchboard-py-echo", "version": version}
            answer(message, {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                             "serverInfo": info})  # fmt: skip
        elif method == "tools/list":
            answer(message, {"tools": TOOLS})
        elif method == "tools/call":
            said = json.dumps({"version": version, "mark": MARK, "script": __file__})
            answer(message, {"content": [{"type": "text", "text": said}]})
        elif method == "ping":
            answer(message, {})
        else:
            error = {"code": -32601, "message": f"Method not found: {method}"}
            print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}), flush=True)
