"""The door's second line (handoff/loop_lag.py): a loop kept busy is seen late within a few samples, and on time
again once it is not; with GATEWAY_MAX_LOOP_LAG_MS at 0 nothing is refused for it."""

import asyncio
import time

from handoff.loop_lag import LoopLag, _watch
from tests.helpers import until


def _busy(seconds: float) -> None:
    """The loop's thread kept on work it does not yield from (a large frame, say)."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def test_a_loop_kept_busy_is_seen_late_and_on_time_again_once_it_is_not(settings):
    settings.GATEWAY_MAX_LOOP_LAG_MS = 5

    async def scenario():
        LoopLag.seconds = 0.0
        watching = asyncio.create_task(_watch(asyncio.get_running_loop().create_future()))
        try:
            late = []
            for _ in range(20):  # each step holds the loop 30 ms: every sample the watcher takes is 20 ms late
                before = LoopLag.seconds
                _busy(0.03)
                await until(lambda before=before: LoopLag.seconds != before, timeout=5)  # the watcher's late sample
                late.append(LoopLag.too_late())
            seen_late = LoopLag.seconds
            await until(lambda: not LoopLag.too_late(), timeout=5)
            return late, seen_late, LoopLag.seconds
        finally:
            watching.cancel()

    late, seen_late, after = asyncio.run(scenario())
    assert late[-1] is True and seen_late * 1000 > 2 * 5, (late, seen_late)  # twice the line
    assert late.index(True) <= 10, late  # within a few samples of the loop running late
    assert after * 1000 <= 5


def test_the_line_is_off_at_zero(settings):
    settings.GATEWAY_MAX_LOOP_LAG_MS = 0
    LoopLag.seconds = 10.0
    try:
        assert LoopLag.too_late() is False
        settings.GATEWAY_MAX_LOOP_LAG_MS = 50
        assert LoopLag.too_late() is True
    finally:
        LoopLag.seconds = 0.0
