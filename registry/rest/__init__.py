"""REST upstreams, transport-free: an OpenAPI 3.0/3.1 document (or hand-declared operations) read and checked
(document), its operations as MCP tools (operations), and each tool call as an HTTP request and its answer as
a CallToolResult (calls). The executor does the HTTP; nothing here opens a connection but through the fetcher
it is given."""
