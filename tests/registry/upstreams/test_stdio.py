"""registry/upstreams/stdio.py's _write, the direct line's write into a server's input, with real processes: a line
longer than a pipe holds is partly queued, and then waited for."""

import asyncio
import sys

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from registry.upstreams.stdio import _write

LINE = b"x" * (1 << 20) + b"\n"  # past a pipe's 64 KiB and the transport's high-water mark: its rest is queued
COUNT_INPUT = "import sys; print(len(sys.stdin.buffer.read()))"


def test_a_line_partly_queued_reaches_the_server_whole_and_once():
    async def main() -> bytes:
        with anyio.fail_after(5):
            async with await anyio.open_process([sys.executable, "-c", COUNT_INPUT]) as process:
                await _write(process.stdin, LINE)
                await process.stdin.aclose()
                return await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 100)

    assert anyio.run(main) == str(len(LINE)).encode()


def test_a_server_gone_while_the_line_is_queued_is_a_broken_pipe():
    async def main() -> None:
        with anyio.fail_after(5):
            async with await anyio.open_process(["sleep", "30"]) as process:  # reads nothing
                asyncio.get_running_loop().call_soon(process.kill)  # once _write waits on the queue
                with pytest.raises(anyio.BrokenResourceError):
                    await _write(process.stdin, LINE)

    anyio.run(main)
