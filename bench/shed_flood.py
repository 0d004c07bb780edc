"""bench/shed.py's flood: raw HTTP clients of each kind, in a process of its own placed on the flood's side of the
machine, and the session records a flood of new sessions leaves in Redis."""

import asyncio
import json
import multiprocessing
import os
import time
from pathlib import Path

from tests.clients import INITIALIZE, slow_post, stateless_body, stateless_headers

GATEWAY_CPU = {0}  # `apart`: the gateway's core; everything else runs on the others


def _request(kind: str, host: str, port: int, key: str) -> bytes:
    """One flooding request of `kind`, encoded once: the flood spends its CPU sending, not building requests."""
    tool = "demo__sleep" if kind in ("calls", "capacity") else "demo__echo"
    headers = stateless_headers(key, tool) | {"host": f"{host}:{port}"}
    body = stateless_body(tool, {"seconds": 0.2} if tool == "demo__sleep" else {"text": "x"})
    if kind == "sessions":  # a new 2025-11-25 session each time, never closed: no 2026-07-28 headers
        headers = {name: headers[name] for name in ("host", "authorization", "accept", "content-type")}
        body = json.dumps(INITIALIZE).encode()
    if kind == "bodies":  # and the connection closed after it: the rest of such a body is not read
        body, headers["connection"] = b" " * (2 * 1024 * 1024), "close"
    if kind == "headers":
        headers |= {f"x-filler-{n}": "y" * 1000 for n in range(100)}
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return f"POST /mcp HTTP/1.1\r\n{head}content-length: {len(body)}\r\n\r\n".encode() + body


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    """An HTTP/1.1 answer's status and headers, its body read (by length or by chunks) and dropped."""
    status_line, *lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in lines if b": " in line)
    if b"content-length" in headers:
        await reader.readexactly(int(headers[b"content-length"]))
    elif headers.get(b"transfer-encoding") == b"chunked":
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            await reader.readexactly(size + 2)
        await reader.readuntil(b"\r\n")
    return int(status_line.split()[1]), headers


async def _flooder(kind: str, url: str, key: str, until: float, answers: list, hostile: bool) -> None:
    """One flooding client on a keep-alive connection of its own (a new one when the door closes it): requests of
    its kind back to back until `until`; (status, seconds, retry-after) each. A raw client, so that the flood's CPU
    goes to the door rather than to an HTTP library."""
    if kind == "slow":
        return await _slow(url, key, until, answers)
    host, port = url.removeprefix("http://").split(":")
    request = _request(kind, host, int(port), key)
    writer = None
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, int(port), limit=2**20)
            writer.write(request)
            status, headers = await _answer(reader)
            retry = headers.get(b"retry-after")
            answers.append((status, time.monotonic() - started, retry))
            if headers.get(b"connection") == b"close":
                writer.close()
                writer = None
            if retry and not hostile:  # a client that does as it is told (and stops with the phase)
                await asyncio.sleep(min(float(retry), until - time.monotonic()))
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            answers.append((type(exc).__name__, time.monotonic() - started, None))
            if writer is not None:
                writer.close()
            writer = None
    if writer is not None:
        writer.close()


async def _slow(url: str, key: str, until: float, answers: list) -> None:
    """Headers, then a byte of a 64-byte body every half second: a client that holds its request open."""
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            reader, writer = await slow_post(url, key)
            status = None
            for _ in range(64):
                if time.monotonic() >= until:
                    break
                writer.write(b" ")
                await writer.drain()
                try:
                    line = await asyncio.wait_for(reader.readline(), 0.5)  # the trickle's pace, and a read
                except TimeoutError:
                    continue
                status = int(line.split()[1]) if line.startswith(b"HTTP/") else "closed"
                break
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) if status not in (None, "closed") else b""
            retry = b"retry-after:" in head.lower()
            answers.append((status or "held", time.monotonic() - started, "1" if retry else None))
            writer.close()
        except OSError as exc:
            answers.append((type(exc).__name__, time.monotonic() - started, None))


def place(placement: str, niced: bool) -> None:
    """This process (every thread of it) where `placement` puts the flood's side of the machine."""
    everything = set(range(os.cpu_count() or 1))
    cpus = everything - GATEWAY_CPU if placement == "apart" else everything
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except ProcessLookupError:  # a helper thread that has ended meanwhile
            continue
    if niced and placement != "shared":
        os.nice(19)


def pin(session_ids: set[int], cpus: set[int]) -> None:
    """Every thread of every process in these process sessions (a server with its upstreams) onto `cpus`."""
    for task in Path("/proc").glob("[0-9]*/task/[0-9]*"):
        try:
            session = int((task / "stat").read_text().rsplit(")", 1)[1].split()[3])
            if session in session_ids:
                os.sched_setaffinity(int(task.name), cpus)
        except (OSError, ValueError):  # gone meanwhile
            continue


def flood(
    kind: str,
    url: str,
    key: str,
    clients: int,
    seconds: float,
    hostile: bool,
    placement: str,
    out: "multiprocessing.Queue",
) -> None:
    """In a process of its own: `clients` flooders of `kind` for `seconds`; their answers and CPU onto `out`."""
    place(placement, niced=True)
    answers: list = []
    until = time.monotonic() + seconds

    async def main() -> None:
        await asyncio.gather(*(_flooder(kind, url, key, until, answers, hostile) for _ in range(clients)))

    asyncio.run(main())
    times = os.times()
    out.put((answers, times.user + times.system))


def _redis():
    import redis

    return redis.Redis.from_url(os.environ["REDIS_URL"])


def _redis_keys(pattern: str) -> list[bytes]:
    from django.conf import settings

    return list(_redis().scan_iter(f"{settings.GATEWAY_REDIS_PREFIX}{pattern}", count=1000))


def session_records() -> int:
    """The 2025-11-25 session records in Redis, whoever opened them."""
    return len(_redis_keys("mcp-session:*"))


def sessions_count_reset(agent: int) -> None:
    """`agent`'s count of opened sessions (handoff/session_limit.py) starts again."""
    if keys := _redis_keys(f"mcp-opened:{agent}:*"):
        _redis().delete(*keys)
