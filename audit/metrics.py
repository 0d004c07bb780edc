"""`GET /metrics`: Prometheus text of this web process (calls, errors, latencies by upstream, open sessions:
audit/telemetry.py) plus, read at scrape time, each upstream's circuit and the live handoff tunnels.

With GATEWAY_METRICS_TOKEN set, a scraper sends it as a bearer token; without it, only loopback may scrape,
and not through a proxy."""

import hmac
from collections.abc import Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from handoff.models import Tunnel
from policy.limits import limit_store
from registry.models import Upstream

LOOPBACK = ("127.0.0.1", "::1")
CIRCUIT_STATES = ("closed", "half-open", "open")


def _circuits() -> GaugeMetricFamily:
    help_text = "1 for the state each enabled upstream's circuit is in"
    return GaugeMetricFamily("switchboard_circuit_state", help_text, labels=["upstream", "state"])


def _tunnels() -> GaugeMetricFamily:
    return GaugeMetricFamily("switchboard_live_tunnels", "Handoff tunnels connecting or open")


class GatewayStateCollector(Collector):
    def describe(self) -> list[GaugeMetricFamily]:
        return [_circuits(), _tunnels()]  # what registering needs to know, without reading the database

    def collect(self) -> Iterator[GaugeMetricFamily]:
        circuits = _circuits()
        store = limit_store()
        for upstream in Upstream.objects.filter(enabled=True).only("id", "slug"):
            current = store.breaker(upstream.id).state
            for state in CIRCUIT_STATES:
                circuits.add_metric([upstream.slug, state], 1.0 if state == current else 0.0)
        yield circuits
        tunnels = _tunnels()
        tunnels.add_metric([], Tunnel.objects.filter(state__in=Tunnel.LIVE).count())
        yield tunnels


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
