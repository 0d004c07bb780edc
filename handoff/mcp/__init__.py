"""The MCP layer, free of any transport: its entry `handle(message, session, caller)` (handle.py), the handler
table (server.py: method -> handler), tools/list and tools/call (tools.py), a call's path from decision to
completion row (pipeline/), resources, prompts and completions (passthrough.py), and what travels beside a
request (progress, upstream asks, list changes). Start here for "where is tools/call"."""
