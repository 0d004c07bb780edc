"""Code mode (docs/code-mode.md), in one place: the two built-in tools (tools.py), an execution decided,
audited and run (run.py), and its pure parts: tool bindings and their TypeScript types (bindings.py,
typescript.py), tool search (search.py, embeddings.py, vectors.py), the Deno sandbox (sandbox.py) and its
slots (slots.py)."""
