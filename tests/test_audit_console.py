"""The console's reading side without a browser: keyset pages, filters, who sees payloads, streamed exports,
and the dashboard's sums."""

import json
import re
import uuid

import pytest
from django.contrib.auth.models import Group

from audit.models import SEAL_SERVERS, AuditEvent
from audit.selectors import AUDITOR_GROUP, AuditFilter, audit_page
from audit.services import audit_record
from gateway_project.dashboard import Latency, window_stats
from registry.models import Upstream
from tests.helpers import audit_mark


def rows_of(tool: str) -> AuditFilter:
    form = AuditFilter({"tool": tool})
    assert form.is_valid()
    return form


def test_pages_walk_the_trail_newest_first_and_back_without_counting_it(db):
    tool = f"paged-{uuid.uuid4().hex[:8]}"
    ids = [audit_record(kind="completed", tool=tool).id for _ in range(7)]
    rows = rows_of(tool).events()
    first = audit_page(rows=rows, size=3)
    second = audit_page(rows=rows, before=first.older, size=3)
    last = audit_page(rows=rows, before=second.older, size=3)
    assert [[r.id for r in p.rows] for p in (first, second, last)] == [ids[6:3:-1], ids[3:0:-1], ids[:1]]
    assert (first.newer, last.older) == (None, None)
    back = audit_page(rows=rows, after=second.newer, size=3)
    assert [r.id for r in back.rows] == ids[6:3:-1] and back.newer is None and back.older == first.older


def test_filters_combine_and_a_malformed_one_is_refused_with_its_reason(admin_client):
    request_id, trace_id = uuid.uuid4(), uuid.uuid4().hex
    audit_record(kind="approved", request_id=request_id, trace_id=trace_id, upstream="filt", tool="t")
    audit_record(kind="completed", request_id=request_id, trace_id=trace_id, upstream="filt", tool="t", outcome="error",
                 error_code="UPSTREAM_TIMEOUT")  # fmt: skip
    page = admin_client.get("/admin/audit/auditevent/", {"trace_id": trace_id, "outcome": "error"}).content.decode()
    assert page.count('class="request-link"') == 1 and "UPSTREAM_TIMEOUT" in page
    refused = admin_client.get("/admin/audit/auditevent/", {"trace_id": "nope"}).content.decode()
    assert "trace_id: 32 hex digits" in refused and 'id="audit-rows"' not in refused
    story = admin_client.get(f"/admin/audit/auditevent/request/{request_id}/").content.decode()
    assert story.count('class="audit-step') == 2
    assert admin_client.get(f"/admin/audit/auditevent/request/{uuid.uuid4()}/").status_code == 404


def test_the_browser_the_export_and_the_api_find_a_persons_rows(admin_client, admin_token):
    person = f"grace-{uuid.uuid4().hex[:8]}"
    who = {"person_issuer": "https://idp.test", "person_subject": person, "person_name": "Grace H", "client_id": "desk"}
    mine = audit_record(kind="completed", request_id=uuid.uuid4(), upstream="demo", tool="echo", **who)
    audit_record(kind="completed", request_id=uuid.uuid4(), upstream="demo", tool="echo", person_subject="other")
    page = admin_client.get("/admin/audit/auditevent/", {"person": person}).content.decode()
    assert page.count('class="request-link"') == 1
    assert f'title="{person} at https://idp.test, through desk">Grace H</span>' in page
    story = admin_client.get(f"/admin/audit/auditevent/request/{mine.request_id}/").content.decode()
    assert f"Grace H ({person} at https://idp.test), through client desk" in story
    export = admin_client.get("/admin/audit/auditevent/export.jsonl", {"person": person, "client": "desk"})
    [exported] = [json.loads(line) for line in b"".join(export.streaming_content).decode().splitlines()]
    assert {name: exported[name] for name in who} == who
    feed = admin_client.get("/api/v1/audit", {"person": person}, HTTP_AUTHORIZATION=f"Bearer {admin_token}").json()
    assert [(row["id"], row["person_name"], row["client_id"]) for row in feed["results"]] == [
        (mine.id, "Grace H", "desk")
    ]


@pytest.fixture
def payload_row(db) -> AuditEvent:
    return audit_record(
        kind="approved", request_id=uuid.uuid4(), upstream="pay", tool="t", detail={"arguments": {"secret": "p4yl0ad"}}
    )


def test_argument_payloads_are_shown_to_the_auditor_group_only(admin_client, payload_row):
    url = f"/admin/audit/auditevent/request/{payload_row.request_id}/"
    export = f"/admin/audit/auditevent/export.jsonl?request_id={payload_row.request_id}"
    hidden = admin_client.get(url).content.decode()
    hidden_export = b"".join(admin_client.get(export).streaming_content).decode()
    auditors = Group.objects.get(name=AUDITOR_GROUP)
    auditors.user_set.add(admin_client.session["_auth_user_id"])
    try:
        shown = admin_client.get(url).content.decode()
        shown_export = b"".join(admin_client.get(export).streaming_content).decode()
    finally:
        auditors.user_set.clear()
    assert "p4yl0ad" not in hidden and "p4yl0ad" not in hidden_export
    assert "p4yl0ad" in shown and json.loads(shown_export)["detail"]["arguments"] == {"secret": "p4yl0ad"}


def test_an_export_streams_every_matching_row_and_is_itself_audited(admin_client):
    tool = f"exported-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        audit_record(kind="completed", upstream="exp", tool=tool, outcome="ok", duration_ms=2.0)
    mark = audit_mark()
    response = admin_client.get("/admin/audit/auditevent/export.csv", {"tool": tool})
    assert response.streaming and response["Content-Type"] == "text/csv; charset=utf-8"
    lines = b"".join(response.streaming_content).decode().splitlines()
    assert len(lines) == 4 and lines[0].startswith("id,created_at,kind,")
    [record] = AuditEvent.objects.filter(id__gt=mark, detail__action="audit_exported")
    assert (
        record.actor == "operator" and record.detail["filters"] == {"tool": tool} and record.detail["format"] == "csv"
    )
    assert admin_client.get("/admin/audit/auditevent/export.xml").status_code == 400


def test_the_dashboard_sums_calls_errors_and_latency_percentiles_per_upstream(db):
    upstream = f"dash{uuid.uuid4().hex[:6]}"
    for ms in range(1, 21):
        audit_record(kind="completed", upstream=upstream, tool="t", outcome="error" if ms % 5 == 0 else "ok",
                     duration_ms=float(ms))  # fmt: skip
    audit_record(kind="approved", upstream=upstream, tool="t")  # not a completion: not counted
    audit_record(kind="completed", tool="t", outcome="ok")  # no upstream (no call's row): not a row of the table
    stats = window_stats(window="hour")
    assert "" not in stats.totals
    total = stats.totals[upstream]
    assert (total.calls, total.errors, total.error_rate, total.p50, total.p95) == (20, 4, 0.2, 10.5, 19.05)
    chart = stats.chart_data()
    assert sum(chart["calls"][upstream]) == 20 and len(chart["labels"]) == 12


def test_a_time_range_keeps_exactly_the_rows_written_inside_it(db):
    tool = f"timed-{uuid.uuid4().hex[:8]}"
    first, second, third = (audit_record(kind="completed", tool=tool) for _ in range(3))
    form = AuditFilter({"tool": tool, "since": second.created_at.isoformat(), "until": third.created_at.isoformat()})
    assert form.is_valid(), form.errors
    assert [r.id for r in form.events()] == [second.id]
    empty = AuditFilter({"tool": tool, "since": "2001-01-01T00:00", "until": "2001-01-02T00:00"})
    assert empty.is_valid() and not empty.events().exists()


def test_staff_without_the_view_permission_sees_no_trail(db, payload_row):
    from django.contrib.auth import get_user_model
    from django.test import Client

    clerk = get_user_model().objects.create_user("audit-clerk", password="clerk-pw-for-tests", is_staff=True)
    client = Client()
    client.force_login(clerk)
    try:
        urls = ["/admin/audit/auditevent/", f"/admin/audit/auditevent/request/{payload_row.request_id}/",
                f"/admin/audit/auditevent/{payload_row.id}/change/", "/admin/audit/auditevent/export.csv",
                "/admin/dashboard/"]  # fmt: skip
        statuses = [client.get(url).status_code for url in urls]
        dashboard = client.get("/admin/").content.decode()
    finally:
        clerk.delete()
    assert statuses == [403, 403, 403, 403, 403]
    assert 'id="dashboard"' not in dashboard


def test_the_dashboard_lists_every_enabled_upstream_an_idle_one_with_no_calls(admin_client):
    idle = Upstream.objects.create(slug=f"idle-{uuid.uuid4().hex[:6]}", transport="stdio", command="idle-server")
    off = Upstream.objects.create(slug=f"off-{uuid.uuid4().hex[:6]}", transport="stdio", command="x", enabled=False)
    try:
        assert window_stats(window="hour").totals[idle.slug] == Latency(calls=0, errors=0, p50=None, p95=None)
        pages = [admin_client.get(url) for url in ("/admin/", "/admin/dashboard/?window=day")]
    finally:
        idle.delete()
        off.delete()
    for page in pages:
        row = re.search(rf">{idle.slug}</a></td>\s*<td>(\d+)</td>", page.content.decode())
        assert page.status_code == 200 and row and row.group(1) == "0"
        assert off.slug not in page.content.decode()
    fragment = pages[1].content.decode()
    assert "<!DOCTYPE html>" not in fragment and 'id="dashboard-data"' in fragment and 'id="people-totals"' in fragment


def test_the_dashboard_lists_the_busiest_people_with_their_errors(admin_client):
    issuer, zed = "https://idp.test", f"zed-{uuid.uuid4().hex[:8]}"
    for outcome in ("ok", "ok", "error"):
        audit_record(kind="completed", upstream="demo", tool="echo", outcome=outcome, person_issuer=issuer,
                     person_subject=zed, person_name="Zed Z")  # fmt: skip
    stats = window_stats(window="hour")
    [mine] = [row for row in stats.people if row["person_subject"] == zed]
    assert (mine["name"], mine["calls"], mine["errors"], mine["person_issuer"]) == ("Zed Z", 3, 1, issuer)
    page = admin_client.get("/admin/").content.decode()
    assert f'href="/admin/audit/auditevent/?person={zed}" title="{zed} at {issuer}">Zed Z</a>' in page


def test_the_dashboard_counts_live_workers_in_celery_mode_only(admin_client, admin_executor):
    page = admin_client.get("/admin/").content.decode()
    if admin_executor == "inline":
        assert 'id="workers-alive"' not in page, "the embedded default has no workers"
    else:
        alive = re.search(r'<strong id="workers-alive">(\d+)</strong> workers alive', page)
        assert alive and int(alive.group(1)) >= 1, "the test worker beats"


def test_the_browser_shows_each_rows_team_and_an_export_keeps_team_and_seal_as_stored(admin_client):
    """A row from before teams (seal 0) shows as the default team's; the export holds what its MAC covers."""
    tool = f"teamed-{uuid.uuid4().hex[:8]}"
    old = audit_record(kind="completed", tool=tool, agent_name="old-bot", seal=0)
    new = audit_record(kind="completed", tool=tool, agent_name="new-bot", team="payments", request_id=uuid.uuid4())
    page = admin_client.get("/admin/audit/auditevent/", {"tool": tool}).content.decode()
    cells = re.findall(r"<td>(old-bot|new-bot)</td>\s*<td>([a-z]*)</td>", page)
    assert cells == [("new-bot", "payments"), ("old-bot", "default")]
    story = admin_client.get(f"/admin/audit/auditevent/request/{new.request_id}/").content.decode()
    assert "<dt>Team</dt><dd>payments</dd>" in story
    export = admin_client.get("/admin/audit/auditevent/export.jsonl", {"tool": tool})
    rows = [json.loads(line) for line in b"".join(export.streaming_content).decode().splitlines()]
    assert [(r["id"], r["team"], r["seal"]) for r in rows] == [(new.id, "payments", SEAL_SERVERS), (old.id, "", 0)]
