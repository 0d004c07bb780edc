"""Fuzz target: one agent's session through the MCP layer, in this process and without a transport. The input
becomes a handful of frames (the handshake or not, then requests and notifications of the gateway's methods with
fuzzed params, ids and envelopes), each sent as `/mcp/ws` would: JSON text through the frame checks
(frames.py) and then to `handle`, one message after the other, the gateway's questions answered with an error.

What must hold: every request gets exactly one reply, last, with its own id, within a bound (conversation.py); every
message that comes back can be put on the wire; an error is a JSON-RPC error the gateway means (the SDK's
generic "Internal server error" is an exception nobody handled); nothing is logged as an error.

The session's agent is FUZZ_AGENT, and the database is DATABASE_URL's: tests/fuzz/test_atheris.py makes both.

    .venv/bin/python -m tests.fuzz.session -max_total_time=60   (libFuzzer's flags)
"""

import asyncio
import functools
import json
import os
import sys
from typing import Any

import atheris

with atheris.instrument_imports(include=["handoff.mcp"]):
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()

    from handoff.mcp.caller import Caller
    from policy.models import Agent
    from tests.fuzz.conversation import converse
    from tests.helpers import snapshot_current

METHODS = [
    "initialize", "ping", "tools/list", "tools/call", "resources/list", "resources/templates/list",
    "resources/read", "resources/subscribe", "resources/unsubscribe", "prompts/list", "prompts/get",
    "completion/complete", "logging/setLevel", "notifications/initialized", "notifications/cancelled",
    "notifications/progress", "notifications/roots/list_changed", "tools/frobnicate",
]  # fmt: skip
# `sleep`, `progress` and `ask` take time by design, and code mode's `execute` starts a sandbox: left out.
TOOLS = ["fuzz__echo", "fuzz__add", "fuzz__nested", "fuzz__leak", "fuzz__needs_sampling", "echo", "fuzz__"]
KEYS = [
    "name", "arguments", "uri", "cursor", "ref", "argument", "level", "requestId", "progressToken", "progress",
    "protocolVersion", "capabilities", "clientInfo", "type", "value", "text", "_meta", "reason",
]  # fmt: skip
VERSION, CAPABILITIES = "io.modelcontextprotocol/protocolVersion", "io.modelcontextprotocol/clientCapabilities"
HANDSHAKE = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "1"}}
GENERIC = "Internal server error"


def json_value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> Any:
    kind = fdp.ConsumeIntInRange(0, 7 if depth < 5 else 4)
    match kind:
        case 0:
            return None
        case 1:
            return fdp.ConsumeBool()
        case 2:
            return fdp.ConsumeInt(fdp.ConsumeIntInRange(1, 9))
        case 3:
            return fdp.ConsumeFloat()
        case 4 | 5:
            return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 24))
        case 6:
            return [json_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
        case _:
            return {key(fdp): json_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 5))}


def key(fdp: atheris.FuzzedDataProvider) -> str:
    return fdp.PickValueInList(KEYS) if fdp.ConsumeIntInRange(0, 3) else fdp.ConsumeUnicode(8)


def params(fdp: atheris.FuzzedDataProvider, method: str, modern: bool) -> Any:
    if fdp.ConsumeIntInRange(0, 9) == 0:
        return json_value(fdp)
    made = {key(fdp): json_value(fdp, 1) for _ in range(fdp.ConsumeIntInRange(0, 3))}
    if method == "tools/call" and fdp.ConsumeBool():
        made["name"] = fdp.PickValueInList(TOOLS)
    if method == "initialize" and fdp.ConsumeBool():
        made = HANDSHAKE | made
    if modern:
        meta = {VERSION: "2026-07-28" if fdp.ConsumeIntInRange(0, 4) else json_value(fdp, 3)}
        made["_meta"] = meta | ({CAPABILITIES: {}} if fdp.ConsumeIntInRange(0, 4) else {key(fdp): json_value(fdp, 3)})
    return made


def frames(fdp: atheris.FuzzedDataProvider) -> list[str]:
    """The input as the text frames of one session."""
    modern = fdp.ConsumeIntInRange(0, 3) == 0
    sent = []
    if not modern and fdp.ConsumeIntInRange(0, 7):
        sent += [{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": HANDSHAKE}]
        sent += [{"jsonrpc": "2.0", "method": "notifications/initialized"}]
    for n in range(fdp.ConsumeIntInRange(1, 6)):
        method = fdp.PickValueInList(METHODS) if fdp.ConsumeIntInRange(0, 7) else fdp.ConsumeUnicode(12)
        frame: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if not method.startswith("notifications/"):
            frame["id"] = n + 1 if fdp.ConsumeIntInRange(0, 5) else json_value(fdp, 4)
        if fdp.ConsumeIntInRange(0, 7):
            frame["params"] = params(fdp, method, modern)
        sent.append(frame)
    return [json.dumps(frame) for frame in sent]


@functools.cache
def context() -> tuple[asyncio.Runner, Caller]:
    """One event loop for every input, as a web process has, and FUZZ_AGENT as the caller."""
    runner = asyncio.Runner()
    runner.run(snapshot_current())
    agent = Agent.objects.get(name=os.environ["FUZZ_AGENT"])
    return runner, Caller(agent_id=agent.id, agent_name=agent.name, transport="test", key_prefix="fuzz")


def TestOneInput(data: bytes) -> None:  # noqa: N802 (libFuzzer's name)
    runner, caller = context()
    runner.run(converse(caller, frames(atheris.FuzzedDataProvider(data))))


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
