"""Resumable SSE streams for 2025-11-25 clients: the newest events of each stream, kept in this process,
so a client whose stream broke reconnects with `Last-Event-ID` and gets what it missed (the SDK primes each
stream with an event id and a `retry` hint once a store is given).

Bounded by a total event count: memory stays flat, and the oldest events go first. A client that comes
back to another web process, or after its events went, starts afresh (as without a store).
"""

import itertools
from collections import OrderedDict, deque

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.types import JSONRPCMessage


class RecentEvents(EventStore):
    def __init__(self, max_events: int) -> None:
        self._max_events = max_events
        self._streams: dict[StreamId, OrderedDict[EventId, JSONRPCMessage | None]] = {}
        self._order: deque[tuple[StreamId, EventId]] = deque()  # every kept event, oldest first
        self._ids = itertools.count()

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = f"{stream_id}:{next(self._ids)}"
        self._streams.setdefault(stream_id, OrderedDict())[event_id] = message
        self._order.append((stream_id, event_id))
        while len(self._order) > self._max_events:
            old_stream, old_event = self._order.popleft()
            events = self._streams.get(old_stream)
            if events is not None:
                events.pop(old_event, None)
                if not events:
                    del self._streams[old_stream]
        return event_id

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        stream_id = last_event_id.rpartition(":")[0]
        events = self._streams.get(stream_id)
        if events is None or last_event_id not in events:
            return None
        after = False
        for event_id, message in list(events.items()):
            if after and message is not None:  # priming events carry no message
                await send_callback(EventMessage(message, event_id))
            after = after or event_id == last_event_id
        return stream_id
