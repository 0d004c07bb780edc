"""The stage histogram's samples are a prometheus_client Histogram's, for the same observations."""

import pytest
from prometheus_client import CollectorRegistry, Histogram

from audit.stage_histogram import StageHistogram

BUCKETS = (0.001, 0.01, 0.1, float("inf"))


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def test_its_samples_are_those_of_a_histogram_given_the_same_observations():
    folded_registry, plain_registry = CollectorRegistry(), CollectorRegistry()
    folded = StageHistogram("calls_seconds", "stages", BUCKETS, registry=folded_registry)
    plain = Histogram("calls_seconds", "stages", ["stage"], buckets=BUCKETS, registry=plain_registry)
    # On a bound, under the first, between, past the last finite one: each in the bucket Prometheus puts it in.
    calls = [{"route": 0.001, "execute": 0.5}, {"route": 0.0002, "execute": 0.01}, {"route": 0.05}]
    for timers in calls:
        folded.observe(timers)
        for stage, seconds in timers.items():
            plain.labels(stage).observe(seconds)
    assert _samples(folded_registry) == _samples(plain_registry)
    assert folded_registry.get_sample_value("calls_seconds_bucket", {"stage": "route", "le": "0.001"}) == 2
    assert folded_registry.get_sample_value("calls_seconds_count", {"stage": "execute"}) == 2
    assert folded_registry.get_sample_value("calls_seconds_sum", {"stage": "execute"}) == pytest.approx(0.51)


def test_a_stage_never_observed_has_no_samples():
    registry = CollectorRegistry()
    StageHistogram("calls_seconds", "stages", BUCKETS, registry=registry)
    assert _samples(registry) == {}


def test_buckets_must_end_with_infinity():
    with pytest.raises(ValueError, match=r"the last bucket must be \+Inf: every observation falls in one"):
        StageHistogram("calls_seconds", "stages", (0.1, 1.0), registry=CollectorRegistry())
