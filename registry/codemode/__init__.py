"""Code mode's pure parts: tool bindings and their TypeScript types, tool search, the Deno sandbox.
The MCP side (the two built-in tools, policy and audit of the calls code makes) is handoff/codemode.py."""
