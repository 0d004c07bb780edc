"""`/mcp`, Streamable HTTP in the project's own code for both protocol eras: a 2025-11-25 session's POST, GET
and DELETE (legacy.py) over a session store (sessions.py) and resumable SSE streams (streams.py), and
2026-07-28's self-contained POST (modern.py). Every message goes to the MCP layer (`handle`, or `start` for a
request); replies go out as JSON, or as SSE only when the exchange needs a stream (wire.py)."""
