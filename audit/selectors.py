"""Reading the audit trail: filtered pages, one request's story, and streamed slices for export.

Pages are keyset-paginated on the primary key (newest first): each page is one index range scan whatever
its depth, and no query counts the whole table.
"""

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from audit.models import DEFAULT_TEAM, SEAL_TEAMS, AuditEvent

AUDITOR_GROUP = "Auditor"  # made by a migration; its members alone see argument payloads
PAGE_SIZE = 50
STREAM_CHUNK = 5_000


class AuditFilter(forms.Form):
    """The audit browser's filters; every one is optional and all of them combine."""

    since = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    until = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    kind = forms.ChoiceField(required=False, choices=[("", "any kind"), *AuditEvent.Kind.choices])
    agent = forms.CharField(required=False, max_length=64)
    person = forms.CharField(required=False, max_length=255, help_text="The subject a token named")
    client = forms.CharField(required=False, max_length=255, help_text="The OAuth client acting for a person")
    upstream = forms.CharField(required=False, max_length=32)
    tool = forms.CharField(required=False, max_length=256)
    outcome = forms.ChoiceField(required=False, choices=[("", "any outcome"), *AuditEvent.Outcome.choices])
    error_code = forms.CharField(required=False, max_length=48)
    request_id = forms.UUIDField(required=False, label="Request id")
    trace_id = forms.RegexField(
        required=False, label="Trace id", regex=r"^[0-9a-f]{32}$", error_messages={"invalid": "32 hex digits"}
    )

    FIELDS = {
        "kind": "kind",
        "agent": "agent_name",
        "person": "person_subject",
        "client": "client_id",
        "upstream": "upstream",
        "tool": "tool",
        "outcome": "outcome",
        "error_code": "error_code",
        "request_id": "request_id",
        "trace_id": "trace_id",
    }

    def events(self) -> QuerySet[AuditEvent]:
        """The matching rows, newest first (call after is_valid())."""
        data = self.cleaned_data
        rows = AuditEvent.objects.filter(
            **{column: data[name] for name, column in self.FIELDS.items() if data.get(name) not in (None, "")}
        )
        if data.get("since"):
            rows = rows.filter(created_at__gte=data["since"], id__gte=_first_id_from(data["since"] - CLOCK_SLACK))
        if data.get("until"):
            rows = rows.filter(created_at__lt=data["until"], id__lte=_last_id_before(data["until"] + CLOCK_SLACK))
        return rows.order_by("-id")


# A time range also bounds the primary key, so a page is a short scan of its index wherever the range lies
# (rather than a walk back from the newest row). Ids follow time only roughly (a row's time is taken just
# before its insert), hence the slack; the exact bound stays on created_at.
CLOCK_SLACK = timedelta(minutes=1)


def _first_id_from(moment: datetime) -> int:
    found = AuditEvent.objects.filter(created_at__gte=moment).order_by("created_at").values_list("id", flat=True)
    return found.first() or 2**63 - 1


def _last_id_before(moment: datetime) -> int:
    found = AuditEvent.objects.filter(created_at__lt=moment).order_by("-created_at").values_list("id", flat=True)
    return found.first() or 0


@dataclass(frozen=True)
class Page:
    rows: list[AuditEvent]
    older: int | None  # the id to pass as `before` for the next page, None on the last
    newer: int | None  # the id to pass as `after` for the previous page, None on the first


def audit_page(
    *, rows: QuerySet[AuditEvent], before: int | None = None, after: int | None = None, size: int = PAGE_SIZE
) -> Page:
    """One page of `rows` (newest first), older than `before` or newer than `after`."""
    if after is not None:
        found = list(rows.filter(id__gt=after).order_by("id")[: size + 1])
        more_newer, found = len(found) > size, found[:size][::-1]
        more_older = bool(found) and rows.filter(id__lt=found[-1].id).exists()
    else:
        if before is not None:
            rows = rows.filter(id__lt=before)
        found = list(rows[: size + 1])
        more_older, found = len(found) > size, found[:size]
        more_newer = before is not None and bool(found)
    return Page(
        rows=found,
        older=found[-1].id if found and more_older else None,
        newer=found[0].id if found and more_newer else None,
    )


def request_story(*, request_id: uuid.UUID) -> list[AuditEvent]:
    """Every row of one request, in the order they were written."""
    return list(AuditEvent.objects.filter(request_id=request_id).order_by("id"))


def audit_stream(
    *, rows: QuerySet[AuditEvent], fields: list[str], oldest_first: bool = False, chunk: int = STREAM_CHUNK
) -> Iterator[dict[str, Any]]:
    """Every matching row's id and `fields`, newest (or oldest) first, a keyset chunk of `chunk` rows at a time,
    for as many rows as there are."""
    ordered, bound = rows.order_by("id" if oldest_first else "-id"), None
    beyond = "id__gt" if oldest_first else "id__lt"
    while True:
        page = ordered if bound is None else ordered.filter(**{beyond: bound})
        found = list(page.values("id", *fields)[:chunk])
        yield from found
        if len(found) < chunk:
            return
        bound = found[-1]["id"]


def audit_of_teams(*, rows: QuerySet[AuditEvent], teams: frozenset[str] | None) -> QuerySet[AuditEvent]:
    """Only the rows of those teams (every row for None: a gateway admin's). A row sealed before teams is the
    default team's; a row of no team (a console sign-in, a token refused at the door) is a gateway admin's."""
    if teams is None:
        return rows
    mine = Q(seal__gte=SEAL_TEAMS, team__in=teams)
    return rows.filter(mine | Q(seal__lt=SEAL_TEAMS) if DEFAULT_TEAM in teams else mine)


def is_auditor(request: HttpRequest) -> bool:
    return request.user.groups.filter(name=AUDITOR_GROUP).exists()


def shown_detail(detail: dict[str, Any], auditor: bool) -> dict[str, Any]:
    """The detail as this user may see it: without argument payloads unless an auditor."""
    return detail if auditor else {k: v for k, v in detail.items() if k != "arguments"}
