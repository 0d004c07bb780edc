"""One connection to Redis per event loop for a call's Lua scripts and commands (`redis_clients.script_run`,
`redis_clients.command`), shared by every task of the loop: commands are written as they come, replies are matched
to their callers in order and parsed by hiredis. A call runs three scripts; redis-py's asyncio client spends 50-80 us
of this process's CPU on each, this line 10-15 us, and concurrent calls share its socket's reads and writes
(bench/redis_line.py).

Its contract is redis-py's: the same replies (integers, bytes, nested lists, None) and the same exceptions
(a Redis error as its `redis.exceptions` class; ConnectionError when Redis is away or the socket drops,
TimeoutError when Redis stops answering). Everything else stays on redis-py."""

import asyncio
import os
import threading
from collections import deque
from functools import cache
from typing import Any

import hiredis

# A hung Redis fails the commands waiting on it within this bound (or twice it, below), and so does a connection
# that does not open.
TIMEOUT_SECONDS = 5.0
# What a URL may say for this line; anything else (TLS, socket options) is left to redis-py.
SERVED = frozenset({"host", "port", "db", "username", "password", "path"})
_INCOMPLETE = object()  # hiredis's answer while a reply is still arriving


class _Protocol(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        from redis._parsers.base import BaseParser

        self.loop = loop
        self.reader = hiredis.Reader(replyError=BaseParser.parse_error, notEnoughData=_INCOMPLETE)
        self.waiters: deque[asyncio.Future] = deque()
        self.transport: asyncio.Transport | None = None
        self.replies = 0  # read by the watchdog: whether Redis answered anything since its last look
        self.watchdog: asyncio.TimerHandle | None = None
        self.failure: Exception | None = None  # once set, the line opens another connection for the next command

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        try:
            while (reply := self.reader.gets()) is not _INCOMPLETE:
                self.replies += 1
                if not self.waiters:  # out of step with Redis: nothing after it can be trusted
                    return self.fail(_error("ConnectionError", "Protocol error from Redis: a reply nobody asked for"))
                waiter = self.waiters.popleft()
                if not waiter.done():  # its caller was cancelled: the reply is read and dropped, the line stays in step
                    waiter.set_result(reply)
        except hiredis.ProtocolError as exc:
            self.fail(_error("ConnectionError", f"Protocol error from Redis: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.failure = self.failure or _error("ConnectionError", "Connection closed by server.")
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():  # an exception each: one raised in many tasks would gather all their tracebacks
                waiter.set_exception(type(self.failure)(*self.failure.args))

    def fail(self, failure: Exception) -> None:
        """Drop the connection: every command waiting on it fails with `failure`."""
        self.failure = self.failure or failure
        if self.transport is not None:
            self.transport.abort()  # connection_lost follows, on the loop's next turn

    async def send(self, packed: bytes) -> Any:
        waiter = self.loop.create_future()
        self.waiters.append(waiter)
        self.transport.write(packed)  # type: ignore[union-attr]
        if self.watchdog is None:
            self.watchdog = self.loop.call_later(TIMEOUT_SECONDS, self._watch, self.replies)
        reply = await waiter
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _watch(self, replies: int) -> None:
        """One timer for every command in flight rather than one each: a command waiting a whole period with no
        reply at all from Redis fails the connection (replies come in order: nothing behind it can be answered)."""
        self.watchdog = None
        if not self.waiters:
            return
        if self.replies == replies:
            self.fail(_error("TimeoutError", "Timeout reading from Redis"))
        else:
            self.watchdog = self.loop.call_later(TIMEOUT_SECONDS, self._watch, self.replies)


class Line:
    """A loop's connection to one Redis, opened at its first command and again after it drops."""

    def __init__(self, loop: asyncio.AbstractEventLoop, options: dict[str, Any]) -> None:
        self.loop = loop
        self.options = options
        self._protocol: _Protocol | None = None
        self._opening = asyncio.Lock()

    async def command(self, *args: Any) -> Any:
        try:
            packed = hiredis.pack_command(args)
        except TypeError as exc:  # as redis-py says it: an argument Redis cannot be sent (None, a dict)
            raise _error("DataError", str(exc)) from exc
        protocol = self._protocol
        if protocol is None or protocol.failure is not None:
            protocol = await self._open()
        return await protocol.send(packed)

    async def _open(self) -> _Protocol:
        async with self._opening:  # the first of several callers opens it; the others use it
            if self._protocol is not None and self._protocol.failure is None:
                return self._protocol
            protocol = _Protocol(self.loop)
            try:
                await self._connect(protocol)
                if "password" in self.options:  # the handshake's replies are bounded as any command's are
                    await protocol.send(hiredis.pack_command(("AUTH", *self._credentials())))
                if self.options.get("db"):
                    await protocol.send(hiredis.pack_command(("SELECT", self.options["db"])))
            except BaseException:
                protocol.fail(_error("ConnectionError", "Connection to Redis not completed"))
                raise
            self._protocol = protocol
            return protocol

    async def _connect(self, protocol: _Protocol) -> None:
        o = self.options
        where = o.get("path") or f"{o.get('host', 'localhost')}:{o.get('port', 6379)}"
        try:
            async with asyncio.timeout(TIMEOUT_SECONDS):
                if "path" in o:
                    await self.loop.create_unix_connection(lambda: protocol, o["path"])
                else:
                    await self.loop.create_connection(lambda: protocol, o.get("host", "localhost"), o.get("port", 6379))
        except TimeoutError as exc:
            raise _error("TimeoutError", f"Timeout connecting to {where}") from exc
        except OSError as exc:  # as redis-py says it (the loops word strerror each their own way)
            reason = f"Error {exc.errno} connecting to {where}. {os.strerror(exc.errno)}." if exc.errno else str(exc)
            raise _error("ConnectionError", reason) from exc

    def _credentials(self) -> tuple[str, ...]:
        username, password = self.options.get("username"), self.options["password"]
        return (username, password) if username else (password,)


def _error(name: str, message: str) -> Exception:
    import redis.exceptions

    return getattr(redis.exceptions, name)(message)


# Lines belong to their loop; a process may run several (web, pool thread, tests).
_lines: dict[tuple[int, str], Line] = {}
_lines_lock = threading.Lock()


def line_for(url: str) -> Line | None:
    """This event loop's line to the Redis of `url`, or None when the URL asks for what only redis-py does."""
    loop = asyncio.get_running_loop()
    key = (id(loop), url)
    line = _lines.get(key)
    if line is not None:  # the line holds its loop, so no other loop takes that id while it is here
        return line
    if (options := _options(url)) is None:
        return None
    with _lines_lock:
        for gone in [k for k, held in _lines.items() if held.loop.is_closed()]:
            del _lines[gone]  # a finished loop's line: its socket closes with it
        line = _lines[key] = Line(loop, options)
    return line


@cache
def _options(url: str) -> dict[str, Any] | None:
    from redis.connection import UnixDomainSocketConnection, parse_url

    options = parse_url(url)
    if options.pop("connection_class", None) not in (None, UnixDomainSocketConnection):  # TLS
        return None
    return options if SERVED.issuperset(options) else None
