"""A stdio MCP server that tries what a malicious package among the upstreams would: its tool `probe` answers JSON
naming everything it could reach; `fill` fills its /tmp, `grow` its memory, `fork` its process table and `spin` a
core, and `rlimits` says its own (tests/test_sandbox.py). Given, as JSON in its first argument: `files` to read,
`tcp` ports on loopback, `hosts` (address and port) and `sockets` (Unix) to connect to, `write` paths to create,
and `processes`, the host's ids of processes whose environment it tries to read (the gateway, the worker)."""

import json
import os
import resource
import socket
import subprocess
import sys
import time

import anyio
from mcp import types
from mcp.server import NotificationOptions, Server

TARGETS = json.loads(sys.argv[1])


def _attempt(action) -> bool:
    try:
        action()
    except OSError:
        return False
    return True


def _read(path: str) -> None:
    with open(path, "rb") as file:
        file.read(1)


def _connect(family: int, address) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        sock.connect(address)


def _tcp(address: tuple[str, int]) -> None:
    _connect(socket.AF_INET, address)


def _write(path: str) -> None:
    with open(path, "w") as file:
        file.write("owned")


def _environ_secrets(pid: str) -> list[str]:
    """The names of the secret settings a process's environment shows, if this server can read it."""
    try:
        environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return []
    return sorted(e.split(b"=", 1)[0].decode() for e in environ if e.startswith((b"DATABASE_URL=", b"REDIS_URL=")))


def probe() -> dict:
    ours = {str(os.getpid()), str(os.getppid()), "1"}
    visible = [name for name in os.listdir("/proc") if name.isdigit()]
    return {
        "uid": os.getuid(),
        "read": [path for path in TARGETS["files"] if _attempt(lambda p=path: _read(p))],
        "tcp": [port for port in TARGETS["tcp"] if _attempt(lambda p=port: _connect(socket.AF_INET, ("127.0.0.1", p)))],
        "hosts": [f"{h}:{p}" for h, p in TARGETS.get("hosts", []) if _attempt(lambda a=(h, p): _tcp(a))],
        "sockets": [path for path in TARGETS["sockets"] if _attempt(lambda p=path: _connect(socket.AF_UNIX, p))],
        "wrote": [path for path in TARGETS["write"] if _attempt(lambda p=path: _write(p))],
        "environ": {pid: names for pid in [*TARGETS["processes"], *visible] if (names := _environ_secrets(pid))},
        "other_processes": sorted(set(visible) - ours, key=int),
        "home_writable": _attempt(lambda: _write(os.path.join(os.environ.get("HOME", "/nonexistent"), "mine"))),
    }


def fill(most_mib: int) -> dict:
    """Writes /tmp/fill a MiB at a time, up to `most_mib` or the first error; then removes it."""
    written, error = 0, ""
    try:
        with open("/tmp/fill", "wb") as file:
            while written < most_mib:
                file.write(b"x" * (1 << 20))
                file.flush()
                written += 1
    except OSError as exc:
        error = exc.strerror or str(exc)
    finally:
        os.unlink("/tmp/fill")
    return {"written_mib": written, "error": error}


def grow(most_mib: int) -> dict:
    """Holds `most_mib` MiB, a MiB at a time, each page touched."""
    held = [bytearray(b"x" * (1 << 20)) for _ in range(most_mib)]
    return {"held_mib": len(held)}


def fork(most: int) -> dict:
    """Starts up to `most` processes that sleep, until the first refusal; then ends them."""
    started, error = [], ""
    try:
        while len(started) < most:
            started.append(subprocess.Popen(["sleep", "60"]))
    except OSError as exc:
        error = exc.strerror or str(exc)
    for child in started:
        child.kill()
        child.wait()
    return {"started": len(started), "error": error}


def spin(seconds: float) -> dict:
    """Spins on a core for `seconds` of wall clock; says how much CPU it was given."""
    start, cpu = time.monotonic(), time.process_time()
    while time.monotonic() - start < seconds:
        pass
    return {"cpu_share": (time.process_time() - cpu) / (time.monotonic() - start)}


def rlimits() -> dict:
    return {name: resource.getrlimit(getattr(resource, f"RLIMIT_{name.upper()}"))[0] for name in ("nofile", "fsize")}


TOOLS = {
    "probe": (probe, "What it can reach."),
    "fill": (fill, "Fills /tmp, up to most_mib."),
    "grow": (grow, "Holds most_mib MiB of memory."),
    "fork": (fork, "Starts up to most processes."),
    "spin": (spin, "Spins a core for seconds."),
    "rlimits": (rlimits, "Its open files and file size limits."),
}


async def list_tools(ctx, params) -> types.ListToolsResult:
    any_arguments = {"type": "object"}
    tools = [types.Tool(name=name, description=said, input_schema=any_arguments) for name, (_, said) in TOOLS.items()]
    return types.ListToolsResult(tools=tools)


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    said = TOOLS[params.name][0](**(params.arguments or {}))
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(said))])


server = Server("hostile", version="1.0", on_list_tools=list_tools, on_call_tool=call_tool)


async def serve() -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options(NotificationOptions()))


if __name__ == "__main__":
    anyio.run(serve)
