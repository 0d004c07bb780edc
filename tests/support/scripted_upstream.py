"""A 2025-11-25 stdio server whose tools answer as a test needs, bytes for bytes (examples/demo_upstream.py, on
the SDK, can only answer well). Every line it reads is appended to the file named by its argument, for the test
to see what reached it.

Tools: `id` answers with the request's id as its text; `malformed` with a line that is no JSON; `error` with a
JSON-RPC error; `server_error` with one in -32000, the code the SDK also gives a closed connection; `hang` never
answers; `die` exits with status 7 unanswered; `later` with a result carrying a 2026-07-28 input round's fields;
`raw` writes its argument's `lines` as they are, each `@ID` in them the request's id. With a second argument,
2026-07-28, it speaks that era instead (its lists carry that era's members; its tools still answer as above).
"""

import json
import os
import sys

HELLO = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "s", "version": "1"}}
TOOLS = [
    {"name": name, "inputSchema": {"type": "object"}}
    for name in ("id", "malformed", "error", "server_error", "hang", "die", "later", "raw")
]
MODERN = "2026-07-28"
FRESH = {"resultType": "complete", "ttlMs": 0, "cacheScope": "private"}  # what a 2026-07-28 list result must carry
DISCOVERED = {"supportedVersions": [MODERN], "capabilities": {"tools": {}}, "serverInfo": HELLO["serverInfo"]} | FRESH


def answer(request_id: object, result: dict) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")


def called(request_id: object, tool: str, arguments: dict) -> None:
    match tool:
        case "id":
            answer(request_id, {"content": [{"type": "text", "text": json.dumps(request_id)}]})
        case "malformed":
            sys.stdout.write('{"jsonrpc": "2.0", "id": ' + json.dumps(request_id) + ', "result": \n')
        case "error":
            error = {"code": -32010, "message": "no such record", "data": {"record": 7}}
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}) + "\n")
        case "server_error":
            error = {"code": -32000, "message": "the database is down"}
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}) + "\n")
        case "die":
            os._exit(7)
        case "later":  # a 2026-07-28 input round's fields, which a 2025-11-25 session does not know
            asked = {"answer": {"method": "roots/list"}}
            done = [{"type": "text", "text": "done"}]
            answer(request_id, {"content": done, "resultType": "input_required", "inputRequests": asked})
        case "raw":
            for line in arguments["lines"]:
                sys.stdout.write(line.replace("@ID", json.dumps(request_id)) + "\n")


def main() -> None:
    modern = sys.argv[2:] == [MODERN]
    with open(sys.argv[1], "a") as seen:
        for line in sys.stdin:
            seen.write(line)
            seen.flush()
            message = json.loads(line)
            method, request_id = message.get("method"), message.get("id")
            if request_id is None or method is None:
                continue  # a notification, or the answer to a request of `raw`'s
            if method == "initialize" and not modern:
                answer(request_id, HELLO)
            elif method == "server/discover" and modern:
                answer(request_id, DISCOVERED)
            elif method == "tools/list":
                answer(request_id, {"tools": TOOLS} | (FRESH if modern else {}))
            elif method == "tools/call":
                called(request_id, message["params"]["name"], message["params"].get("arguments") or {})
            else:
                error = {"code": -32601, "message": "Method not found"}
                sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
