"""`GET /metrics`: Prometheus text of this web process (calls, errors, latencies by upstream, open sessions,
HTTP requests: audit/telemetry.py) plus, read at scrape time, each upstream's circuit, its health and whether it
is up, the live handoff tunnels and (Celery executor) the live workers.

With GATEWAY_METRICS_TOKEN set, a scraper sends it as a bearer token; without it, only loopback may scrape,
and not through a proxy."""

import hmac
import logging
from collections.abc import Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway_project.lib import redis_clients
from handoff.models import Tunnel
from policy.limits.stores import limit_store
from registry.models import Upstream
from registry.worker import workers_alive_sync

logger = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "::1")
CIRCUIT_STATES = ("closed", "half-open", "open")


def _circuits() -> GaugeMetricFamily:
    help_text = "1 for the state each enabled upstream's circuit is in"
    return GaugeMetricFamily("switchboard_circuit_state", help_text, labels=["upstream", "state"])


def _tunnels() -> GaugeMetricFamily:
    return GaugeMetricFamily("switchboard_live_tunnels", "Handoff tunnels connecting or open")


def _upstreams_up() -> GaugeMetricFamily:
    help_text = "1 while an enabled upstream answers, 0 while it fails; none while it was never reached"
    return GaugeMetricFamily("switchboard_upstream_up", help_text, labels=["upstream"])


def _upstream_health() -> GaugeMetricFamily:
    help_text = "1 for the health each enabled upstream is in: ok, failing or unknown (never reached)"
    return GaugeMetricFamily("switchboard_upstream_health", help_text, labels=["upstream", "state"])


def _workers() -> GaugeMetricFamily:
    help_text = "Workers whose heartbeat is under 3 s old (Celery executor only)"
    return GaugeMetricFamily("switchboard_workers_alive", help_text)


class GatewayStateCollector(Collector):
    def describe(self) -> list[GaugeMetricFamily]:
        # what registering needs to know, without reading the database
        return [_circuits(), _upstreams_up(), _upstream_health(), _tunnels(), _workers()]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        circuits, up, health = _circuits(), _upstreams_up(), _upstream_health()
        store = limit_store()
        for upstream in Upstream.objects.filter(enabled=True):
            current = store.breaker(upstream.id).state
            for state in CIRCUIT_STATES:
                circuits.add_metric([upstream.slug, state], 1.0 if state == current else 0.0)
            for state in Upstream.Health.values:
                health.add_metric([upstream.slug, state], 1.0 if state == upstream.health else 0.0)
            # Never reached is not down: no sample, so an alert on 0 fires only on a real failure.
            if upstream.health != Upstream.Health.UNKNOWN:
                up.add_metric([upstream.slug], 1.0 if upstream.health == Upstream.Health.OK else 0.0)
        yield circuits
        yield up
        yield health
        tunnels = _tunnels()
        tunnels.add_metric([], Tunnel.objects.filter(state__in=Tunnel.LIVE).count())
        yield tunnels
        if settings.GATEWAY_EXECUTOR == "celery":
            yield from self._live_workers()

    def _live_workers(self) -> Iterator[GaugeMetricFamily]:
        try:
            alive = workers_alive_sync()
        except redis_clients.RedisError:  # the rest of the scrape is still worth having; /readyz says Redis is down
            logger.exception("cannot count live workers")
            return
        workers = _workers()
        workers.add_metric([], alive)
        yield workers


REGISTRY.register(GatewayStateCollector())


def _allowed(request: HttpRequest) -> bool:
    token = settings.GATEWAY_METRICS_TOKEN
    if not token:  # a request a proxy on this host forwarded comes from loopback too: it names its client
        forwarded = any(name in request.headers for name in ("Forwarded", "X-Forwarded-For", "X-Real-Ip"))
        return request.META.get("REMOTE_ADDR") in LOOPBACK and not forwarded
    scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(sent.encode(), token.encode())


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        refusal = "Send the metrics token: Authorization: Bearer <GATEWAY_METRICS_TOKEN>."
        challenge = {"WWW-Authenticate": 'Bearer realm="metrics"'}
        return HttpResponse(refusal, status=401, content_type="text/plain", headers=challenge)
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
