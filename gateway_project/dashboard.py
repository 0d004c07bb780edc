"""What the console's front page shows: per-upstream calls, error rate and latency over a window, as totals
(every enabled upstream's, an idle one's zero too) and as a series of buckets for the charts, and the gateway's
state right now (circuits, sessions, tunnels, tools waiting for approval, calls waiting for sign-off, live
workers). It reads across apps; it writes nothing. Given the teams an account audits or administers (None: a
gateway admin's, every team), each figure holds only what concerns those teams (docs/teams.md)."""

import logging
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, F, Max, Q
from django.utils import timezone

from audit.models import AuditEvent
from audit.selectors import audit_of_teams
from gateway_project.lib import redis_clients
from handoff.models import Tunnel
from policy.limits.stores import limit_store
from policy.models import SignOff
from policy.selectors import in_teams
from registry.models import PinnedItem, Tool, Upstream
from registry.worker import workers_alive_sync

logger = logging.getLogger(__name__)

# Each window, the width of its chart's buckets, and how a bucket is labelled.
WINDOWS = {
    "hour": (timedelta(hours=1), timedelta(minutes=5), "%H:%M"),
    "day": (timedelta(days=1), timedelta(hours=1), "%d %b %H:00"),
}
REFRESH_SECONDS = 10  # how often the page fetches its figures again: a few cheap queries, the trail's index


@dataclass
class Latency:
    calls: int = 0
    errors: int = 0
    p50: float | None = None
    p95: float | None = None

    @property
    def error_rate(self) -> float:
        return self.errors / self.calls if self.calls else 0.0


@dataclass
class WindowStats:
    buckets: list[datetime]
    label_format: str
    totals: dict[str, Latency] = field(default_factory=dict)  # by upstream
    series: dict[str, dict[datetime, Latency]] = field(default_factory=dict)  # by upstream, then bucket
    people: list[dict[str, Any]] = field(default_factory=list)  # the busiest people: who, calls, errors

    def chart_data(self) -> dict[str, Any]:
        """Per upstream, one list per measure, aligned with `labels`."""
        empty = Latency()
        rows = {
            upstream: [by_bucket.get(bucket, empty) for bucket in self.buckets]
            for upstream, by_bucket in sorted(self.series.items())
        }
        return {
            "labels": [bucket.strftime(self.label_format) for bucket in self.buckets],
            "calls": {u: [b.calls for b in row] for u, row in rows.items()},
            "error_rate": {
                u: [round(100 * b.error_rate, 2) if b.calls else None for b in row] for u, row in rows.items()
            },
            "p50": {u: [b.p50 for b in row] for u, row in rows.items()},
            "p95": {u: [b.p95 for b in row] for u, row in rows.items()},
        }


def _percent(measure: Latency) -> float | None:
    return round(100 * measure.error_rate, 2) if measure.calls else None


# On PostgreSQL the database aggregates (one pass over the window through the created_at index); elsewhere
# the rows come back and Python does the same sums.
_AGGREGATE = """
SELECT upstream, date_bin(%(step)s, created_at, %(origin)s) AS bucket, count(*),
       count(*) FILTER (WHERE outcome <> 'ok'),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ms),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY duration_ms)
FROM audit_auditevent
WHERE kind = 'completed' AND created_at >= %(since)s AND upstream <> ''
GROUP BY GROUPING SETS ((upstream, bucket), (upstream))
"""


def _percentiles(durations: list[float]) -> tuple[float | None, float | None]:
    if not durations:
        return None, None
    if len(durations) == 1:
        return durations[0], durations[0]
    cuts = statistics.quantiles(durations, n=100, method="inclusive")
    return cuts[49], cuts[94]


def _aggregate_in_python(since: datetime, origin: datetime, step: timedelta) -> list[tuple]:
    groups: dict[tuple[str, datetime | None], list[tuple[str, float | None]]] = defaultdict(list)
    completed = AuditEvent.objects.filter(kind=AuditEvent.Kind.COMPLETED, created_at__gte=since).exclude(upstream="")
    for upstream, at, outcome, duration in completed.values_list("upstream", "created_at", "outcome", "duration_ms"):
        bucket = origin + ((at - origin) // step) * step
        for key in ((upstream, bucket), (upstream, None)):
            groups[key].append((outcome, duration))
    return [
        (
            upstream,
            bucket,
            len(rows),
            sum(o != "ok" for o, _ in rows),
            *_percentiles(sorted(d for _, d in rows if d is not None)),
        )
        for (upstream, bucket), rows in groups.items()
    ]


def window_stats(*, window: str, now: datetime | None = None, teams: frozenset[str] | None = None) -> WindowStats:
    """The window's figures; with `teams`, only the upstreams those teams own (None: every upstream)."""
    span, step, label_format = WINDOWS[window]
    now = now or timezone.now()
    origin = now - span
    stats = WindowStats(buckets=[origin + i * step for i in range(int(span / step))], label_format=label_format)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_AGGREGATE, {"step": step, "origin": origin, "since": origin})
            rows = cursor.fetchall()
    else:
        rows = _aggregate_in_python(origin, origin, step)
    enabled = Upstream.objects.filter(enabled=True)
    if teams is not None:
        # The aggregate stays one pass over the window's index; other teams' upstreams are dropped after it.
        shown = set(Upstream.objects.filter(team__slug__in=teams).values_list("slug", flat=True))
        rows = [row for row in rows if row[0] in shown]
        enabled = enabled.filter(team__slug__in=teams)
    for upstream, bucket, calls, errors, p50, p95 in rows:
        measure = Latency(calls=calls, errors=errors, p50=_ms(p50), p95=_ms(p95))
        if bucket is None:
            stats.totals[upstream] = measure
        else:
            stats.series.setdefault(upstream, {})[bucket] = measure
    for slug in enabled.values_list("slug", flat=True):
        stats.totals.setdefault(slug, Latency())  # an idle upstream is listed too: it is there, with no calls
    stats.people = _busiest_people(origin, teams)
    return stats


BUSIEST = 10


def _busiest_people(since: datetime, teams: frozenset[str] | None) -> list[dict[str, Any]]:
    """The people who made the most calls in the window through those teams' agents, with their errors (the
    console lists them)."""
    completed = AuditEvent.objects.filter(kind=AuditEvent.Kind.COMPLETED, created_at__gte=since).exclude(
        person_subject=""
    )
    completed = audit_of_teams(rows=completed, teams=teams)
    return list(
        completed.values("person_issuer", "person_subject")
        .annotate(name=Max("person_name"), calls=Count("id"), errors=Count("id", filter=Q(outcome="error")))
        .order_by("-calls", "person_subject")[:BUSIEST]
    )


def _ms(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None


@dataclass(frozen=True)
class GatewayState:
    open_circuits: list[tuple[Upstream, Any]]
    failing_upstreams: list[Upstream]
    live_tunnels: list[Tunnel]
    active_sessions: int
    pending_tools: int
    pending_items: int  # resources, prompts and instructions (registry/pinned_items.py)
    workers_alive: int | None  # None with the inline executor, which has no workers
    sandbox_off: bool  # GATEWAY_STDIO_SANDBOX=off: every stdio server runs unconfined
    host_network: list[str]  # stdio upstreams whose sandbox shares the host's network
    held_packages: list[str]  # npx and uvx upstreams whose re-installed package waits for approval
    sign_offs_pending: int = 0  # calls waiting for a person's sign-off
    sign_off_oldest: datetime | None = None  # when the longest-waiting one was asked
    sign_off_median: int | None = None  # seconds from asked to decided, over the last day's decisions


def _workers_alive() -> int | None:
    if settings.GATEWAY_EXECUTOR != "celery":
        return None
    try:
        return workers_alive_sync()
    except redis_clients.RedisError:  # the page still shows what it can; the tile says the count is unknown
        logger.exception("worker heartbeats unreadable")
        return None


def gateway_state(*, now: datetime | None = None, teams: frozenset[str] | None = None) -> GatewayState:
    """The gateway now; with `teams`, only those teams' upstreams, their tools, their agents' tunnels and their
    sessions (the workers and the sandbox switch are the gateway's, shown to all)."""
    now = now or timezone.now()
    store = limit_store()
    upstreams = in_teams(Upstream.objects.all(), teams)
    circuits = [(u, store.breaker(u.id)) for u in upstreams.filter(enabled=True).order_by("slug")]
    # Sessions with anything recorded within the idle timeout (the point at which an idle one is closed)
    # and no closing row: an estimate across every web process, from the trail they all write.
    recent = AuditEvent.objects.filter(created_at__gte=now - timedelta(seconds=settings.GATEWAY_SESSION_IDLE_SECONDS))
    recent = audit_of_teams(rows=recent.exclude(session_id=""), teams=teams)
    closed = recent.filter(kind=AuditEvent.Kind.SESSION, detail__action="session_closed").values("session_id")
    tunnels = in_teams(Tunnel.objects.filter(state__in=Tunnel.LIVE), teams, "agent__team")
    return GatewayState(
        open_circuits=[(u, status) for u, status in circuits if status.state != "closed"],
        failing_upstreams=[u for u, _ in circuits if u.health == Upstream.Health.FAILING],
        live_tunnels=list(tunnels.select_related("agent", "upstream").order_by("-opened_at")[:20]),
        active_sessions=recent.exclude(session_id__in=closed).values("session_id").distinct().count(),
        pending_tools=in_teams(Tool.objects.all(), teams, "upstream__team")
        .exclude(approved_sha256=F("definition_sha256"))
        .count(),
        pending_items=in_teams(PinnedItem.objects.all(), teams, "upstream__team")
        .exclude(approved_sha256=F("definition_sha256"))
        .count(),
        workers_alive=_workers_alive(),
        sandbox_off=settings.GATEWAY_STDIO_SANDBOX == "off",
        host_network=list(upstreams.filter(transport="stdio", sandbox__network="host").values_list("slug", flat=True)),
        held_packages=list(upstreams.filter(package__has_key="held").values_list("slug", flat=True)),
        **_sign_offs(now, teams),
    )


def _sign_offs(now: datetime, teams: frozenset[str] | None) -> dict[str, Any]:
    """Calls waiting for sign-off, the longest wait, and how long a decision took (median, the last day)."""
    pending = in_teams(SignOff.objects.filter(state=SignOff.State.PENDING, wait_until__gt=now), teams)
    oldest = pending.order_by("asked_at").values_list("asked_at", flat=True).first()
    decided = in_teams(SignOff.objects.filter(decided_at__gte=now - timedelta(days=1)), teams)
    waits = [
        (decided_at - asked_at).total_seconds()
        for asked_at, decided_at in decided.values_list("asked_at", "decided_at")
    ]
    return {
        "sign_offs_pending": pending.count(),
        "sign_off_oldest": oldest,
        "sign_off_median": round(statistics.median(waits)) if waits else None,
    }
