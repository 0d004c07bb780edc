"""A tools/call's session state taken from this process's memory instead of Redis: the front door of a 2025-11-25
session this process holds does not read the session's record and handoff entry again for a call (one round trip
fewer); the call's stages run on them as last read, and the call's admission checks, in its own script, that both
are still so (renewing the record, as the door's read does). Anything the call would do before or without its
admission (refuse it, ask a person to sign it off, move a handoff) reads them first. Where they changed, the
stages run again on the state as it is now; where the session ended, the request is answered as the door would
have (docs/internals.md)."""

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass

from policy.limits.admission import Expected


@dataclass(frozen=True, slots=True)
class Unverified:
    record_key: str
    record: bytes
    entry_key: str  # the session's handoff entry (handoff/protocol/tunnels.py)
    entry: bytes | None
    ttl: int  # the record's, renewed by whichever reads it
    read: Callable[["Unverified"], Awaitable[bool]]  # the store's: `reread`

    async def reread(self) -> bool:
        """Reads both again and takes up what changed (the entry as the next look at the index finds it): whether
        anything did. Raises the door's "session not found" when the session ended, SessionStateUnavailable when
        Redis cannot say."""
        return await self.read(self)

    @property
    def expected(self) -> Expected:
        """What the call's admission must find (policy/limits/admission.py `Admission.expected`)."""
        return ((self.record_key, self.record, self.ttl), (self.entry_key, self.entry, 0))


# A list of one, emptied when taken: the tasks a request starts hold the same list in their copies of its context.
_held: ContextVar[list[Unverified] | None] = ContextVar("session_unverified", default=None)


def unverified_hold(state: Unverified) -> None:
    """Said by the front door for the request it serves."""
    _held.set([state])


def unverified_take() -> Unverified | None:
    """The request's unverified state, once: a call's runner takes it for the call."""
    held = _held.get()
    return held.pop() if held else None
