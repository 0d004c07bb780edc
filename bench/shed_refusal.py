"""What a refusal past GATEWAY_MAX_IN_FLIGHT costs the gateway's own Python, in process, and each check before it
(docs/reliability.md, "Load shedding"): the ASGI application is called with a POST while every place is taken.
CPU time per call, in µs; no server, no sockets, so uvicorn's parse and the kernel are not in it.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/switchboard_shed REDIS_URL=redis://127.0.0.1:6379/8 \\
        LOG_LEVEL=WARNING .venv/bin/python bench/shed_refusal.py
"""

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import setup_database  # noqa: E402  (bench/run.py: the same data)

ROUNDS = 5000
BODY = b"{" + b" " * 148 + b"}"


def post_scope(key: str) -> dict:
    headers = [
        (b"host", b"127.0.0.1:8000"),
        (b"authorization", f"Bearer {key}".encode()),
        (b"accept", b"application/json, text/event-stream"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(BODY)).encode()),
        (b"mcp-protocol-version", b"2026-07-28"),
    ]
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/mcp", "raw_path": b"/mcp", "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000),
    }  # fmt: skip


async def receive() -> dict:
    return {"type": "http.request", "body": BODY, "more_body": False}


async def send(message: dict) -> None:
    pass


async def per_call(work: Callable[[], Awaitable[object] | object]) -> float:
    started = time.process_time()
    for _ in range(ROUNDS):
        result = work()
        if asyncio.iscoroutine(result):
            await result
    return (time.process_time() - started) / ROUNDS * 1e6


async def main(key: str) -> None:
    from mcp.server.streamable_http import check_accept_headers
    from starlette.requests import Request

    from gateway_project.asgi import application
    from handoff import http
    from handoff.mcp.caller import caller_from_scope, host_allowed, origin_allowed

    scope = post_scope(key)
    http.InFlight.count = 10**9  # every place taken: each POST is refused
    await per_call(lambda: application(scope, receive, send))  # warm: the snapshot, the routes
    busy = [(b"retry-after", b"1")]
    parts = {
        "the ASGI application (routing, metrics, drain count, mcp_http_app)": lambda: application(scope, receive, send),
        "mcp_http_app": lambda: http.mcp_http_app(scope, receive, send),
        "  the key check (caller_from_scope)": lambda: caller_from_scope(scope, "http"),
        "  the Host and Origin checks": lambda: (host_allowed(scope), origin_allowed(scope)),
        "  the Accept check": lambda: check_accept_headers(Request(scope)),
        "  reading a small body": lambda: http._read_body(receive, 10**6),
        "  the 503 itself": lambda: http.json_answer(send, 503, http.BUSY_BODY, busy),
    }
    for name, work in parts.items():
        print(f"{name}: {await per_call(work):.1f} µs")


if __name__ == "__main__":
    asyncio.run(main(setup_database()))
