"""The audit browser: a read-only, filterable, keyset-paginated list of the trail, the story of one request,
and streamed exports. Argument payloads (kept only with GATEWAY_AUDIT_PAYLOADS) are shown to members of the
Auditor group and to nobody else."""

import csv
import json
import uuid
from collections.abc import Iterator
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path

from audit.models import AuditCheckpoint, AuditEvent
from audit.selectors import (
    AuditFilter,
    audit_of_teams,
    audit_page,
    audit_stream,
    is_auditor,
    request_story,
    shown_detail,
)
from audit.services import audit_record_per_team
from policy.selectors import auditing_teams

# As stored, so that an export can be verified: a row of seal 0 (before teams) has no team and is the default team's.
EXPORT_FIELDS = [
    "created_at", "kind", "request_id", "trace_id", "agent_name", "team", "person_issuer", "person_subject",
    "person_name", "client_id", "session_id", "transport", "server", "upstream", "tool",
    "exposed_name", "outcome", "error_code", "error_detail", "duration_ms", "response_bytes", "arguments_sha256",
    "actor", "detail", "mac", "seal",
]  # fmt: skip


class ReadOnlyAdminMixin:
    """Rows the gateway writes and an operator only reads (actions may still act on them)."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class _Echo:
    def write(self, value: str) -> str:
        return value


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only: the trail is appended to by the gateway and never edited by hand."""

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("request/<uuid:request_id>/", view(self.request_view), name="audit_auditevent_request"),
            path("export.<str:fmt>", view(self.export_view), name="audit_auditevent_export"),
            *super().get_urls(),
        ]

    def _require_view(self, request: HttpRequest) -> None:
        if not self.has_view_permission(request):
            raise PermissionDenied

    def _filters(self, request: HttpRequest) -> AuditFilter:
        self._require_view(request)
        return AuditFilter(request.GET)

    def _teams(self, request: HttpRequest) -> frozenset[str] | None:
        """The teams whose rows this account reads: where it is `auditor` or `admin` (None: a gateway admin)."""
        return auditing_teams(user=request.user)

    def _events(self, request: HttpRequest, form: AuditFilter):
        return audit_of_teams(rows=form.events(), teams=self._teams(request))

    def _story_rows(self, request: HttpRequest, rows: list[AuditEvent]) -> list[AuditEvent]:
        teams = self._teams(request)
        return rows if teams is None else [row for row in rows if row.team_slug in teams]

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        form = self._filters(request)
        page = None
        if form.is_valid():
            before, after = _int(request.GET.get("before")), _int(request.GET.get("after"))
            page = audit_page(rows=self._events(request, form), before=before, after=after)
        query = request.GET.copy()
        for key in ("before", "after"):
            query.pop(key, None)
        context = self.admin_site.each_context(request) | {
            "title": "Audit trail",
            "opts": self.model._meta,
            "form": form,
            "page": page,
            "filter_query": query.urlencode(),
        }
        return TemplateResponse(request, "admin/audit/browser.html", context)

    def _story(self, request: HttpRequest, rows: list[AuditEvent], title: str) -> HttpResponse:
        auditor = is_auditor(request)
        entries = [
            {"event": row, "detail": json.dumps(shown_detail(row.detail, auditor), indent=2, ensure_ascii=False)}
            for row in rows
        ]
        context = self.admin_site.each_context(request) | {
            "title": title,
            "opts": self.model._meta,
            "entries": entries,
            "payloads_hidden": not auditor and any("arguments" in row.detail for row in rows),
        }
        return TemplateResponse(request, "admin/audit/request.html", context)

    def request_view(self, request: HttpRequest, request_id: uuid.UUID) -> HttpResponse:
        self._require_view(request)
        rows = self._story_rows(request, request_story(request_id=request_id))
        if not rows:
            raise Http404(f"No audit rows for request {request_id}")
        return self._story(request, rows, f"Request {request_id}")

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "", extra_context=None):
        self._require_view(request)
        mine = audit_of_teams(rows=AuditEvent.objects.all(), teams=self._teams(request))
        event = get_object_or_404(mine, pk=_int(object_id) or 0)
        rows = self._story_rows(request, request_story(request_id=event.request_id)) if event.request_id else [event]
        return self._story(request, rows, f"Audit event {event.pk}")

    def export_view(self, request: HttpRequest, fmt: str) -> StreamingHttpResponse:
        form = self._filters(request)
        if fmt not in ("csv", "jsonl") or not form.is_valid():
            return HttpResponse("Unknown format or invalid filters.", status=400, content_type="text/plain")
        auditor = is_auditor(request)
        detail = {"action": "audit_exported", "format": fmt, "filters": request.GET.dict(), "payloads": auditor}
        # A row for each team whose trail it holds; a gateway admin's holds every team's: one row of no team.
        details = {team: detail for team in self._teams(request) or ()}
        actor = request.user.get_username()
        audit_record_per_team(kind=AuditEvent.Kind.ADMIN_CHANGE, actor=actor, details=details, gateway_wide=detail)
        rows = audit_stream(rows=self._events(request, form), fields=EXPORT_FIELDS)
        lines = _csv_lines(rows, auditor) if fmt == "csv" else _jsonl_lines(rows, auditor)
        content_type = "text/csv; charset=utf-8" if fmt == "csv" else "application/x-ndjson; charset=utf-8"
        response = StreamingHttpResponse(lines, content_type=content_type)
        response["Content-Disposition"] = f'attachment; filename="audit.{fmt}"'
        return response


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _csv_lines(rows: Iterator[dict[str, Any]], auditor: bool) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(["id", *EXPORT_FIELDS])
    for row in rows:
        row["detail"] = json.dumps(shown_detail(row["detail"], auditor), ensure_ascii=False)
        yield writer.writerow([row["id"], *(row[name] for name in EXPORT_FIELDS)])


def _jsonl_lines(rows: Iterator[dict[str, Any]], auditor: bool) -> Iterator[str]:
    for row in rows:
        row["detail"] = shown_detail(row["detail"], auditor)
        yield json.dumps(row, cls=DjangoJSONEncoder, ensure_ascii=False) + "\n"


@admin.register(AuditCheckpoint)
class AuditCheckpointAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Signed summaries of ranges of the trail; `manage.py audit_verify` checks them."""

    list_display = ("id", "created_at", "first_event_id", "last_event_id", "event_count", "digest")
