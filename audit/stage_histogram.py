"""The histogram of a call's stage timings, by stage: a dozen observations a call, folded in at once.

prometheus_client's Histogram takes a lock and adds to a counter per bucket and to the sum for each
observation (about 0.8 us each, 8-13 us a call's dozen); this one takes its lock once for the call and
keeps plain counts, which become a histogram family only when /metrics is read (a documented custom
collector). Same name, label, buckets and samples as the Histogram it replaces."""

import threading
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence

from prometheus_client import REGISTRY
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString


class StageHistogram(Collector):
    def __init__(
        self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry = REGISTRY
    ) -> None:
        if buckets[-1] != float("inf"):
            raise ValueError("the last bucket must be +Inf: every observation falls in one")
        self._name, self._documentation = name, documentation
        self._bounds = tuple(buckets)
        self._counts: dict[str, list[int]] = {}  # by stage: observations per bucket (not cumulative)
        self._sums: dict[str, float] = {}
        self._lock = threading.Lock()  # calls may run on more than one thread's loop in a process
        registry.register(self)

    def observe(self, seconds_by_stage: Mapping[str, float]) -> None:
        with self._lock:
            for stage, seconds in seconds_by_stage.items():
                counts = self._counts.get(stage)
                if counts is None:
                    counts = self._counts[stage] = [0] * len(self._bounds)
                    self._sums[stage] = 0.0
                counts[bisect_left(self._bounds, seconds)] += 1  # the first bucket whose bound is >= seconds
                self._sums[stage] += seconds

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=["stage"])
        with self._lock:
            kept = [(stage, list(counts), self._sums[stage]) for stage, counts in self._counts.items()]
        for stage, counts, total in kept:
            cumulative, buckets = 0, []
            for bound, count in zip(self._bounds, counts, strict=True):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))
            family.add_metric([stage], buckets, total)
        yield family

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self._name, self._documentation, labels=["stage"])
