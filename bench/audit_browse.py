"""The audit browser at scale: seed an audit table of N rows (10 million by default) spread over 30 days, then
time what an operator does: the first page, paging deep, each filter, a request's story, the dashboard's
hour and day, and the rendered admin page. Medians of repeated runs, in milliseconds, as a Markdown table.

    bench/run audit                 # seeds once (kept in database switchboard_audit; --reseed to redo)
    bench/run audit --rows 1000000

Seeding goes through SQL (generate_series), not the app: the rows carry no valid MAC, which browsing ignores.
"""

import argparse
import hashlib
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")

SEED = """
INSERT INTO audit_auditevent (created_at, kind, request_id, trace_id, agent_id, agent_name, session_id, transport,
    upstream, tool, exposed_name, arguments_sha256, outcome, error_code, error_detail, duration_ms, response_bytes,
    actor, detail, mac)
SELECT now() - (%(span)s * (1 - i::float8 / %(rows)s)) * interval '1 second',
       CASE WHEN i %% 2 = 0 THEN 'approved' ELSE 'completed' END,
       md5((i / 2)::text)::uuid, md5('t' || (i / 2)::text), 1 + i %% 50, 'agent-' || (i %% 50), 's-' || (i / 40),
       'http', 'up' || (i %% 20), 'tool' || (i %% 97), 'up' || (i %% 20) || '__tool' || (i %% 97),
       md5(i::text) || md5(i::text),
       CASE WHEN i %% 2 = 0 THEN '' WHEN i %% 101 = 1 THEN 'error' WHEN i %% 997 = 1 THEN 'timeout' ELSE 'ok' END,
       CASE WHEN i %% 2 = 0 THEN '' WHEN i %% 101 = 1 THEN 'TOOL_ERROR' WHEN i %% 997 = 1 THEN 'UPSTREAM_TIMEOUT'
            ELSE '' END,
       '', CASE WHEN i %% 2 = 1 THEN 1 + (i %% 4000) / 10.0 END, CASE WHEN i %% 2 = 1 THEN 100 + i %% 5000 END,
       '', '{}'::jsonb, 'bench'
FROM generate_series(%(start)s, %(stop)s) AS i
"""
SPAN_SECONDS = 30 * 86_400
BATCH = 1_000_000


def seed(rows: int, reseed: bool) -> None:
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM (SELECT 1 FROM audit_auditevent LIMIT %s) AS present", [rows])
        if cursor.fetchone()[0] >= rows and not reseed:
            return
        cursor.execute("TRUNCATE audit_auditevent, audit_auditcheckpoint RESTART IDENTITY")
        for start in range(0, rows, BATCH):
            began = time.perf_counter()
            stop = min(start + BATCH, rows) - 1
            cursor.execute(SEED, {"rows": rows, "span": SPAN_SECONDS, "start": start, "stop": stop})
            print(f"seeded {stop + 1:,} rows ({time.perf_counter() - began:.1f} s for this batch)", flush=True)
        cursor.execute("VACUUM ANALYZE audit_auditevent")


def median_ms(action: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        action()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def rendered(browser: object, url: str) -> None:
    response = browser.get(url)
    assert response.status_code == 200, response.status_code


def measurements(repeat: int) -> list[tuple[str, float]]:
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.db.models import QuerySet
    from django.test import Client
    from django.utils import timezone

    from audit.selectors import AuditFilter, audit_page, request_story
    from gateway_project.dashboard import window_stats

    def rows_for(**filters: str) -> QuerySet:
        form = AuditFilter(filters)
        assert form.is_valid(), form.errors
        return form.events()

    def page(**filters: str) -> Callable[[], object]:
        rows = rows_for(**filters)
        return lambda: audit_page(rows=rows)

    def walk(pages: int) -> None:
        rows, before = rows_for(), None
        for _ in range(pages):
            before = audit_page(rows=rows, before=before).older

    now = timezone.now()
    week_ago = (now - timedelta(days=7)).strftime("%Y-%m-%dT%H:%M")
    six_days_ago = (now - timedelta(days=6)).strftime("%Y-%m-%dT%H:%M")
    some = str(uuid.UUID(bytes=bytes.fromhex("c4ca4238a0b923820dcc509a6f75849b")))  # md5('1')
    user, _ = get_user_model().objects.get_or_create(username="bench-operator", is_superuser=True, is_staff=True)
    browser = Client(HTTP_HOST="localhost")
    browser.force_login(user)
    return [
        ("first page, no filter", median_ms(page(), repeat)),
        ("page 200, walked by keyset (200 queries)", median_ms(lambda: walk(200), max(1, repeat // 5))),
        ("agent = agent-7", median_ms(page(agent="agent-7"), repeat)),
        ("upstream = up3", median_ms(page(upstream="up3"), repeat)),
        ("tool = tool42", median_ms(page(tool="tool42"), repeat)),
        ("outcome = timeout (0.05 % of rows)", median_ms(page(outcome="timeout"), repeat)),
        ("error code = TOOL_ERROR", median_ms(page(error_code="TOOL_ERROR"), repeat)),
        ("time range: one day a week ago", median_ms(page(since=week_ago, until=six_days_ago), repeat)),
        ("upstream + tool + outcome = error", median_ms(page(upstream="up3", tool="tool42", outcome="error"), repeat)),
        ("request id", median_ms(page(request_id=some), repeat)),
        ("trace id", median_ms(page(trace_id=hashlib.md5(b"t1").hexdigest()), repeat)),
        ("a request's story", median_ms(lambda: request_story(request_id=uuid.UUID(some)), repeat)),
        ("admin page rendered (no filter)", median_ms(lambda: rendered(browser, "/admin/audit/auditevent/"), repeat)),
        (
            "admin page rendered (upstream + outcome)",
            median_ms(lambda: rendered(browser, "/admin/audit/auditevent/?upstream=up3&outcome=error"), repeat),
        ),
        ("dashboard: last hour", median_ms(lambda: window_stats(window="hour"), repeat)),
        ("dashboard: last day", median_ms(lambda: window_stats(window="day"), max(1, repeat // 5))),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--reseed", action="store_true")
    args = parser.parse_args()
    import django

    django.setup()
    seed(args.rows, args.reseed)
    print(f"\n| {args.rows:,} audit rows | median ms |\n|---|---:|")
    for name, ms in measurements(args.repeat):
        print(f"| {name} | {ms:.1f} |", flush=True)


if __name__ == "__main__":
    main()
