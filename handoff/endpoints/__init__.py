"""The gateway's front doors, the only modules that speak HTTP and WebSocket: `/mcp` in both eras (`http.py`,
`streamable_http/`), `/mcp/ws` (`consumers.py`) and the probes (`probes.py`). They frame requests for the MCP
layer (handoff/mcp/), which never imports them (the import-linter contract)."""
