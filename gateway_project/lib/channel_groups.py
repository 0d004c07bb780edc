"""A listener's membership of a channel-layer group, kept. channels_redis lets a membership expire after a day,
and a Redis that was flushed, or that evicted the group's key, forgets it without a word: the listener would hear
nothing more, and nobody would know. So each listener adds itself again every few seconds (a ZADD and an EXPIRE)."""

import asyncio
import logging
from typing import Any

logger = logging.getLogger(__name__)

# How long a listener may go unheard after its Redis forgot it.
RENEW_SECONDS = 10.0
# After a renewal Redis refused (it is away): tried again this soon.
RETRY_SECONDS = 1.0


async def membership_kept(layer: Any, group: str, channel: str, every: float = RENEW_SECONDS) -> None:
    """`channel` in `group` from now on, for as long as this runs: added at once and again every `every`
    seconds; a failure is logged and tried again shortly, never ends it."""
    while True:
        try:
            await layer.group_add(group, channel)
        except Exception:
            logger.warning("channel group %s: membership not renewed (tried again shortly)", group, exc_info=True)
            await asyncio.sleep(min(every, RETRY_SECONDS))
            continue
        await asyncio.sleep(every)
