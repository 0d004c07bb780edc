"""One agent's session as a transport holds it, for the session fuzz target and the property tests: each frame
through the frame checks and `handle`, and what must hold of every message that comes back."""

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from mcp import types

from handoff.mcp.caller import Caller
from handoff.mcp.frames import encode_message
from handoff.mcp.handle import McpSession, handle
from tests.fuzz.checks import check_frame

BOUND = 10.0  # seconds for one request's replies: the demo upstream's tools used here answer at once
GENERIC = "Internal server error"  # the SDK's answer to an exception no handler expected


class Defect(AssertionError):
    pass


class Errors(logging.Handler):
    """Collects what is logged at ERROR or above while an input runs: an exception the gateway did not expect."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Conversation:
    """One session as a transport holds it, checking what comes back."""

    caller: Caller
    pushed: list[types.JSONRPCMessage] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.session = McpSession(self._push, id=f"fuzz-{uuid.uuid4().hex}")

    async def _push(self, message: types.JSONRPCMessage) -> None:
        wire(message)
        self.pushed.append(message)

    async def send(self, text: str) -> list[types.JSONRPCMessage]:
        """What comes back for one frame (none when the frame checks refuse it)."""
        message = check_frame(text)
        if message is None:
            return []
        try:
            async with asyncio.timeout(BOUND):
                replies = [reply async for reply in self._replies(message)]
        except TimeoutError:
            raise Defect(f"no reply within {BOUND} s to {text[:300]}") from None
        if isinstance(message, types.JSONRPCRequest):
            final = replies[-1:] and replies[-1]
            if not isinstance(final, types.JSONRPCResponse | types.JSONRPCError) or final.id != message.id:
                raise Defect(f"the last message for {text[:300]} is not its reply: {replies!r}"[:2000])
            if any(isinstance(r, types.JSONRPCResponse | types.JSONRPCError) for r in replies[:-1]):
                raise Defect(f"two replies to {text[:300]}")
            if isinstance(final, types.JSONRPCError) and final.error.message == GENERIC:
                raise Defect(f"an unexpected exception answered {text[:300]}")
        elif replies:
            raise Defect(f"{text[:300]} is not a request, yet got {replies!r}"[:2000])
        return replies

    async def _replies(self, message: types.JSONRPCMessage) -> AsyncIterator[types.JSONRPCMessage]:
        async for reply in handle(message, self.session, self.caller):
            wire(reply)
            if isinstance(reply, types.JSONRPCRequest):  # a question for the agent: this one declines
                declined = types.ErrorData(code=types.METHOD_NOT_FOUND, message="not answered here")
                async for _ in handle(
                    types.JSONRPCError(jsonrpc="2.0", id=reply.id, error=declined), self.session, self.caller
                ):
                    raise Defect("an answer to the gateway's question got a reply")
            yield reply

    async def close(self) -> None:
        await self.session.close()


def wire(message: types.JSONRPCMessage) -> None:
    """The message as a transport puts it out: a reply always goes, as JSON."""
    text = encode_message(message)
    if text is None and isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
        raise Defect(f"a reply that cannot be encoded: {message!r}"[:2000])
    if text is not None:
        json.loads(text)


async def converse(caller: Caller, texts: list[str]) -> None:
    errors = Errors()
    logging.getLogger().addHandler(errors)
    conversation = Conversation(caller)
    try:
        for text in texts:
            await conversation.send(text)
    finally:
        await conversation.close()
        logging.getLogger().removeHandler(errors)
    if errors.records:
        record = errors.records[0]
        raise Defect(f"logged as an error: {record.getMessage()}\n{texts!r}"[:4000]) from (
            record.exc_info[1] if record.exc_info else None
        )
