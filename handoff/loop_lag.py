"""How late this web process's event loop runs: the second line of the door (handoff/endpoints/http.py) beside the count
of POSTs in flight. A count is a poor measure of work (sixteen 0.2 s calls keep a core busier than sixteen 20 s ones); a
loop that runs late is the work itself, and every admitted call's every step waits that long. A task on the loop sleeps
SAMPLE_SECONDS at a time and keeps a moving average of how late it wakes."""

import asyncio

from django.conf import settings

from gateway_project.lib.process_task import ProcessTask

SAMPLE_SECONDS = 0.01
# Each sample's weight in the average: about the last 50 ms count, so that one slow step (a collection, a large
# frame) does not shed, and a loop that stays late does within a few samples.
WEIGHT = 0.2


class LoopLag:
    """The moving average, in seconds (one event loop: no lock)."""

    seconds = 0.0

    @classmethod
    def too_late(cls) -> bool:
        limit = settings.GATEWAY_MAX_LOOP_LAG_MS
        return limit > 0 and cls.seconds * 1000 > limit


async def _watch(ready: asyncio.Future) -> None:
    loop = asyncio.get_running_loop()
    ready.set_result(None)
    while True:
        before = loop.time()
        await asyncio.sleep(SAMPLE_SECONDS)
        late = max(0.0, loop.time() - before - SAMPLE_SECONDS)
        LoopLag.seconds += WEIGHT * (late - LoopLag.seconds)


loop_lag_watch = ProcessTask(_watch)
