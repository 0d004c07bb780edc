"""The stdio transport: a server as our child process, newline-delimited JSON-RPC on its pipes.

The SDK's `stdio_client` keeps its process to itself, so a server that dies could not say how; this one
tells the connection's witness the exit status (or the signal) the moment the server's output ends, and
marks each request it writes (`Delivery`): one it never wrote is known never to have reached the server. It
follows the same shutdown (MCP lifecycle: close stdin, wait, then end the process tree), every wait bounded
and shielded, so a cancelled caller neither leaks a live server nor hangs on one. A server started before the
gateway's imports (prestart.py) is adopted: its pipes are read and written as the ones of a server started here."""

import asyncio
import logging
import os
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import IO, Any

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, Process
from anyio.streams.memory import MemoryObjectSendStream
from anyio.streams.text import TextReceiveStream
from mcp import types
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from registry.upstreams.direct import DirectLine
from registry.upstreams.launch import Launch, ServerStart, ending, launch
from registry.upstreams.prestart import Prestarted

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


class _PipeReader(ByteReceiveStream):
    """A pipe of ours, read without blocking the loop."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self._pipe = pipe
        os.set_blocking(pipe.fileno(), False)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._pipe.closed:
            try:
                data = os.read(self._pipe.fileno(), max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(self._pipe.fileno())
                continue
            if not data:
                raise anyio.EndOfStream
            return data
        raise anyio.ClosedResourceError

    async def aclose(self) -> None:
        if not self._pipe.closed:
            anyio.notify_closing(self._pipe.fileno())  # a read waiting on it ends rather than wait on a stale fd
            self._pipe.close()


class _PipeWriter(ByteSendStream):
    """A pipe of ours, written without blocking the loop."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self._pipe = pipe
        os.set_blocking(pipe.fileno(), False)

    async def send(self, item: bytes) -> None:
        rest = memoryview(item)
        while rest:
            if self._pipe.closed:
                raise anyio.ClosedResourceError
            try:
                rest = rest[os.write(self._pipe.fileno(), rest) :]
            except BlockingIOError:
                await anyio.wait_writable(self._pipe.fileno())

    async def aclose(self) -> None:
        if not self._pipe.closed:
            anyio.notify_closing(self._pipe.fileno())
            self._pipe.close()


async def _write(stdin: ByteSendStream, line: bytes) -> None:
    """A direct request's line into the server's input; PIPE_ERRORS once the server is known gone, so a request
    that never reached it is never marked written.

    An asyncio pipe transport (stdlib's or uvloop's) with nothing queued writes at once, and on a server gone
    closes at once: the line is known written, or not, with no loop turn (anyio's send would take one, its drain
    another). With bytes queued (a server slow to read), it drops a write to a server gone and says so only some
    writes later (measured: asyncio's 4th empty write, uvloop's 3rd, or the first past its high-water mark): the
    one empty write here lets the loop turn once, and a line queued to a server that died meanwhile may be taken
    as written (the call is then not marked safe to retry). Our own pipes (_PipeWriter) write at once, and their
    empty write costs nothing."""
    stream = getattr(stdin, "_stream", None)  # anyio's wrapper of asyncio's StreamWriter: its transport
    transport = stream.transport if isinstance(stream, asyncio.StreamWriter) else None
    if transport is not None and not transport.get_write_buffer_size():
        if not transport.is_closing():
            transport.write(line)
        if transport.is_closing():
            raise anyio.BrokenResourceError
        if not transport.get_write_buffer_size():
            return
        # Its rest is queued: only the empty write's wait is left.
    else:
        await stdin.send(line)
    await stdin.send(b"")


class _Adopted(Process):
    """A server started before the pool (registry/upstreams/prestart.py), as the transport uses one it started."""

    def __init__(self, process: subprocess.Popen) -> None:
        self._process = process
        self._stdin = _PipeWriter(process.stdin)  # type: ignore[arg-type]
        self._stdout = _PipeReader(process.stdout)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        await self._stdin.aclose()
        await self._stdout.aclose()
        await self.wait()

    async def wait(self) -> int:
        while self.returncode is None:
            await anyio.sleep(POLL)
        return self.returncode

    def terminate(self) -> None:
        self._process.terminate()

    def kill(self) -> None:
        self._process.kill()

    def send_signal(self, signal: int) -> None:
        self._process.send_signal(signal)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.poll()

    @property
    def stdin(self) -> ByteSendStream:
        return self._stdin

    @property
    def stdout(self) -> ByteReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> None:
        return None


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
    start: ServerStart,
    errlog: IO[bytes],
    ended: Callable[[str], None],
    prestarted: Prestarted | None = None,
    direct: DirectLine | None = None,
) -> AsyncIterator[tuple]:
    """The server's streams: the server `prestarted` (started as `start` says, its stderr in `errlog`), else one
    started now as `start` says; `ended` hears how its process ended when its output ends first. `direct`, if
    given, writes its requests on the same pipes and gets their answers before the session sees them."""
    if prestarted is not None:
        launched, process = prestarted.launched, _Adopted(prestarted.process)
    else:
        # In a thread: it reads the file system (the command, its interpreter, the paths it is given, the cgroup's).
        launched = await anyio.to_thread.run_sync(launch, start)
        process = await _started(launched, errlog)
    sandbox, cgroup = start.sandbox, launched.cgroup
    # No await from here until the task group is entered: a cancellation then would leak the process.
    incoming, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    tagged, outgoing = anyio.create_memory_object_stream[tuple[Delivery | None, SessionMessage]](0)
    write_stream = _Tagged(tagged)
    stopping = False
    writing = anyio.Lock(fast_acquire=True)  # lines written whole: the writer and the direct requests take turns

    async def read() -> None:
        async with incoming:
            buffer = ""
            with suppress(*PIPE_ERRORS):
                async for chunk in TextReceiveStream(process.stdout):  # type: ignore[arg-type]
                    *lines, buffer = (buffer + chunk).split("\n")
                    for line in lines:
                        if direct is not None and direct.answered(line):
                            continue
                        item = _parse(line)
                        if direct is None or (item := direct.take(item)) is not None:
                            await incoming.send(item)
            if not stopping:
                await _exited(process, STATUS_WAIT)
                ended(await anyio.to_thread.run_sync(ending, process.returncode, sandbox is not None, cgroup))
            if direct is not None:
                direct.close()

    async def broken() -> None:
        """The server's input broke: it is going. Say how before the session sees the connection end (its cause
        reads that), which otherwise races the reader's own report."""
        if not stopping and await _exited(process, STATUS_WAIT):
            ended(await anyio.to_thread.run_sync(ending, process.returncode, sandbox is not None, cgroup))
        if direct is not None:
            direct.close()
        await incoming.aclose()  # the session sees the connection end rather than wait for an answer

    async def write() -> None:
        try:
            async with outgoing:
                async for delivery, message in outgoing:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    async with writing:
                        await process.stdin.send(data.encode())  # type: ignore[union-attr]
                    if delivery is not None:
                        delivery.written = True
        except PIPE_ERRORS:
            await broken()

    async def send_direct(data: bytes) -> None:
        try:
            async with writing:
                await _write(process.stdin, data)  # type: ignore[arg-type]
        except PIPE_ERRORS:
            await broken()
            raise MCPError(code=types.CONNECTION_CLOSED, message="Connection closed") from None
        if (delivery := sending.get()) is not None:
            delivery.written = True

    if direct is not None:
        direct.bind(send_direct)
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
                if direct is not None:
                    direct.close()
                await _stop(process)
                await _ended(launched)
            tg.cancel_scope.cancel()
