"""How deep JSON text nests, found without parsing it: Python's parser recurses and fails near 1,000 levels,
so frames from agents (handoff/mcp/frames.py) and replies from upstreams (registry/upstreams/reply_depth.py)
are measured first."""

import re

# A JSON string, escapes and all; an unterminated one runs to the end (so no input makes the scan backtrack).
STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)
NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))
OPENING = bytes.maketrans(b"{}", b"[]")
OPEN = ord("[")


def nested_deeper_than(raw: bytes | str, limit: int) -> bool:
    """Whether JSON text nests arrays and objects deeper than `limit`: one linear scan of the text, strings
    left out, without parsing it (Python's parser recurses, and fails near 1,000 levels)."""
    text = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if text.count(b"[") + text.count(b"{") <= limit:  # no deeper than its brackets, strings' own included
        return False
    depth = 0
    for bracket in STRING.sub(b"", text).translate(OPENING, NOT_BRACKETS):
        depth += 1 if bracket == OPEN else -1
        if depth > limit:
            return True
    return False
