"""The stdio transport: a server as our child process, newline-delimited JSON-RPC on its pipes.

The SDK's `stdio_client` keeps its process to itself, so a server that dies could not say how; this one
tells the connection's witness the exit status (or the signal) the moment the server's output ends, and
marks each request it writes (`Delivery`): one it never wrote is known never to have reached the server. It
follows the same shutdown (MCP lifecycle: close stdin, wait, then end the process tree), every wait bounded
and shielded, so a cancelled caller neither leaks a live server nor hangs on one."""

import logging
import os
import shutil
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import IO, Any

import anyio
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectSendStream
from anyio.streams.text import TextReceiveStream
from mcp import StdioServerParameters, types
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from registry.upstreams.limits import Cgroup, cgroup_make, rlimits
from registry.upstreams.outbound import Outbound
from registry.upstreams.sandbox import HOME, SandboxSettings, bwrap_command

logger = logging.getLogger(__name__)

EXIT_GRACE = 2.0  # for the server to exit on its own once its stdin closes, and again after SIGTERM
STATUS_WAIT = 0.5  # for the exit of a server whose output just ended to be seen
POLL = 0.01
PIPE_ERRORS = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError)


@dataclass
class Delivery:
    """Whether a request reached the server's input. The pool sets one in `sending` around each request; the
    transport marks it once the request is written. A request never written never reached the server."""

    written: bool = False


sending: ContextVar[Delivery | None] = ContextVar("sending", default=None)


class _Tagged:
    """The session's write stream: each message travels to the writer with the Delivery of the task that sent
    it (a memory stream does not carry its sender's context)."""

    def __init__(self, inner: MemoryObjectSendStream[tuple[Delivery | None, SessionMessage]]) -> None:
        self._inner = inner

    async def send(self, message: SessionMessage) -> None:
        await self._inner.send((sending.get(), message))

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> "_Tagged":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()


def ending(returncode: int | None, confined: bool = False, cgroup: Cgroup | None = None) -> str:
    """How a server's process ended, in the operator's words. A sandbox's bwrap exits 128 + n for a server ended
    by signal n, as a shell does; a SIGKILL its cgroup counts as a kill at its memory limit is said as that."""
    if returncode is None:
        return "closed its output"
    if confined and 128 < returncode < 128 + signal.NSIG:
        returncode = 128 - returncode
    if returncode == -signal.SIGKILL and cgroup is not None and cgroup.memory_killed():
        return f"was killed: memory limit {cgroup.memory_mb} MiB"
    if returncode < 0:
        with suppress(ValueError):
            return f"was killed by {signal.Signals(-returncode).name}"
        return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


async def _exited(process: Process, timeout: float) -> bool:
    """Whether the process is gone within `timeout` (polling: `wait()` also waits for pipes a grandchild
    may hold open)."""
    with anyio.move_on_after(timeout):
        while process.returncode is None:
            await anyio.sleep(POLL)
    return process.returncode is not None


def _parse(line: str) -> SessionMessage | Exception:
    """One line as a message, or the error for the session to surface (registry/upstreams/reply_depth.py reads it)."""
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


async def _stop(process: Process) -> None:
    with suppress(*PIPE_ERRORS):
        await process.stdin.aclose()  # type: ignore[union-attr]
    if not await _exited(process, EXIT_GRACE):
        await terminate_posix_process_tree(process, EXIT_GRACE)
        if not await _exited(process, EXIT_GRACE):
            logger.warning("stdio server %d outlived its kill; abandoning it", process.pid)
    with suppress(*PIPE_ERRORS):
        await process.stdout.aclose()  # type: ignore[union-attr]


@dataclass
class Launch:
    """How a server starts: its command line, environment and folder; confined, its cgroup and its `outbound`
    network (each None where it has none)."""

    command: list[str]
    env: dict[str, str]
    cwd: Any
    cgroup: Cgroup | None = None
    network: Outbound | None = None

    def release(self) -> None:
        """What it made, for a server that did not start."""
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.network is not None:
            self.network.close()


def launch(params: StdioServerParameters, sandbox: SandboxSettings | None, slug: str) -> Launch:
    """How the server starts: confined, limited and on its network unless `sandbox` is None."""
    env = get_default_environment() | (params.env or {})
    if sandbox is None:
        return Launch([params.command, *params.args], env, params.cwd)
    executable = shutil.which(params.command, path=env.get("PATH"))
    if executable is None:
        raise FileNotFoundError(params.command)
    cwd = str(params.cwd) if params.cwd else None
    made = Launch([], env | {"HOME": HOME}, "/")
    try:
        made.network = Outbound(sandbox.internal) if sandbox.network == "outbound" else None
        options = made.network.bwrap_options() if made.network else []
        command = bwrap_command(os.path.abspath(executable), list(params.args), cwd, sandbox, options)
        command = [*rlimits(), *command]
        made.cgroup = cgroup_make(slug, sandbox)
    except BaseException:
        made.release()
        raise
    made.command = [*(made.cgroup.join() if made.cgroup else []), *command]
    return made


async def _started(launched: Launch, errlog: IO[bytes]) -> Process:
    """The server's process, its network up before it runs (bwrap waits for it)."""
    try:
        process = await anyio.open_process(
            launched.command,
            env=launched.env,
            stderr=errlog,
            cwd=launched.cwd,
            start_new_session=True,  # its own process group, ended as a tree
            pass_fds=[launched.network.info_fd, launched.network.block_fd] if launched.network else (),
        )
    except BaseException:
        launched.release()
        raise
    if launched.network is not None:
        try:
            await launched.network.start()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await _stop(process)
                await _ended(launched)
            raise
    return process


async def _ended(launched: Launch) -> None:
    """Once its server is gone: its network and its cgroup."""
    if launched.network is not None:
        await launched.network.stop()
    if launched.cgroup is not None:
        await anyio.to_thread.run_sync(launched.cgroup.remove)


@asynccontextmanager
async def stdio_transport(
    params: StdioServerParameters,
    errlog: IO[bytes],
    ended: Callable[[str], None],
    sandbox: SandboxSettings | None = None,
    slug: str = "stdio",
) -> AsyncIterator[tuple]:
    """The server's streams, confined by `sandbox` (None: unconfined); `ended` hears how its process ended when
    its output ends first. `slug` names its cgroup."""
    # In a thread: it reads the file system (the command, its interpreter, the paths it is given, the cgroup's).
    launched = await anyio.to_thread.run_sync(launch, params, sandbox, slug)
    process = await _started(launched, errlog)
    cgroup = launched.cgroup
    # No await from here until the task group is entered: a cancellation then would leak the process.
    incoming, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    tagged, outgoing = anyio.create_memory_object_stream[tuple[Delivery | None, SessionMessage]](0)
    write_stream = _Tagged(tagged)
    stopping = False

    async def read() -> None:
        async with incoming:
            buffer = ""
            with suppress(*PIPE_ERRORS):
                async for chunk in TextReceiveStream(process.stdout):  # type: ignore[arg-type]
                    *lines, buffer = (buffer + chunk).split("\n")
                    for line in lines:
                        await incoming.send(_parse(line))
            if not stopping:
                await _exited(process, STATUS_WAIT)
                ended(await anyio.to_thread.run_sync(ending, process.returncode, sandbox is not None, cgroup))

    async def write() -> None:
        try:
            async with outgoing:
                async for delivery, message in outgoing:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode())  # type: ignore[union-attr]
                    if delivery is not None:
                        delivery.written = True
        except PIPE_ERRORS:
            # The server is going: say how before the session sees the connection end (its cause reads that),
            # which otherwise races the reader's own report.
            if not stopping and await _exited(process, STATUS_WAIT):
                ended(await anyio.to_thread.run_sync(ending, process.returncode, sandbox is not None, cgroup))
            await incoming.aclose()  # the session sees the connection end rather than wait for an answer

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        tg.start_soon(write)
        try:
            yield read_stream, write_stream
        finally:
            stopping = True
            with anyio.CancelScope(shield=True):
                read_stream.close()
                write_stream.close()
                await _stop(process)
                await _ended(launched)
            tg.cancel_scope.cancel()
