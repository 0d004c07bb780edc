"""Resumable SSE streams of 2025-11-25 sessions: each stream keeps its events, numbered, until the replay
bound pushes them out, so the response serving it now and one a client resumes it with (`Last-Event-ID`)
read the same events. The producer (a request's task, or the session's pushes) never waits for a reader.

The bound is a count of events over all streams (GATEWAY_SSE_REPLAY_EVENTS): memory stays flat, the oldest
go first, and a client that resumes after some of its events went is told how many it missed."""

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from handoff.endpoints.streamable_http.wire import PING, sse_frame


@dataclass(frozen=True, slots=True)
class Event:
    number: int
    data: str
    final: bool  # the reply that ends a request's stream
    code: int | None = None  # the reply's JSON-RPC error code, when it is an error


class EventStream:
    __slots__ = ("id", "count", "done", "kept", "_events", "_replay", "_changed")

    def __init__(self, stream_id: str, replay: "ReplayBuffer | None" = None) -> None:
        self.id = stream_id  # empty: a stream nobody resumes (2026-07-28), its events sent without ids
        self.count = 0
        self.done = False
        self.kept = False  # whether its events are held for replay: not until it is answered as a stream
        self._events: deque[Event] = deque()
        self._replay = replay
        self._changed = asyncio.Event()

    def event_id(self, number: int) -> str | None:
        return f"{self.id}:{number}" if self.id else None

    def put(self, data: str, final: bool = False, code: int | None = None) -> None:
        self.count += 1
        self._events.append(Event(self.count, data, final, code))
        if self.kept:
            self._replay.hold(self, self.count)
        self._wake()

    def close(self) -> None:
        self.done = True
        self._wake()

    def keep(self) -> None:
        """From now on its events stay for replay (those put so far included)."""
        if not self.kept and self._replay is not None:
            self.kept = True
            for event in self._events:
                self._replay.hold(self, event.number)

    def drop_through(self, number: int) -> None:
        while self._events and self._events[0].number <= number:
            self._events.popleft()

    def gone(self, after: int) -> int:
        """How many events after `after` are gone already."""
        first = self._events[0].number if self._events else self.count + 1
        return max(0, first - after - 1)

    async def missed(self, after: int) -> int:
        return self.gone(after)

    async def first(self, wait: float) -> Event | None:
        """The first event, once it is there (None if none came within `wait` seconds, or the stream ended)."""
        if not self._events and not self.done:
            try:
                async with asyncio.timeout(wait):  # no task of its own, as wait_for would make
                    await self._changed.wait()
            except TimeoutError:
                return None
        return self._events[0] if self._events and self._events[0].number == 1 else None

    async def events(self, after: int, idle: float | None = None) -> AsyncIterator[Event | None]:
        """The events after `after` as they come, None after `idle` seconds of silence, until the stream ends."""
        while True:
            if fresh := [event for event in self._events if event.number > after]:
                for event in fresh:  # more may come while these go out: looked for again before waiting
                    after = event.number
                    yield event
                continue
            if self.done:
                return
            try:
                async with asyncio.timeout(idle):  # no task of its own, as wait_for would make, per waiting stream
                    await self._changed.wait()
            except TimeoutError:
                yield None

    async def frames(self, after: int, idle: float) -> AsyncIterator[bytes]:
        """The SSE frames of the events after `after`, a ping for each `idle` seconds of silence."""
        async for event in self.events(after, idle):
            yield PING if event is None else sse_frame(event.data, self.event_id(event.number))

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


class ReplayBuffer:
    """The bound on events held for replay, over every stream of the process."""

    def __init__(self, bound: int) -> None:
        self._bound = bound
        self._held: deque[tuple[EventStream, int]] = deque()

    def hold(self, stream: EventStream, number: int) -> None:
        self._held.append((stream, number))
        while len(self._held) > self._bound:
            oldest, through = self._held.popleft()
            oldest.drop_through(through)
