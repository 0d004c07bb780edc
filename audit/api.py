"""The read-only audit feed of the REST API: the browser's filters, newest first, keyset-paginated
(`before` = the `next_before` of the previous page), argument payloads for the Auditor group only."""

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_serializer
from rest_framework import serializers, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from audit.models import AuditEvent
from audit.selectors import PAGE_SIZE, AuditFilter, audit_of_teams, audit_page, is_auditor, shown_detail
from policy.selectors import auditing_teams


class AuditEventSerializer(serializers.ModelSerializer):
    detail = serializers.SerializerMethodField()

    class Meta:
        model = AuditEvent
        exclude = ("agent_id",)

    def get_detail(self, event: AuditEvent) -> dict[str, Any]:
        return shown_detail(event.detail, self.context["auditor"])


class PagingSerializer(serializers.Serializer):
    before = serializers.IntegerField(min_value=1, required=False)
    limit = serializers.IntegerField(min_value=1, max_value=500, default=PAGE_SIZE, source="size")


@extend_schema_serializer(many=False)  # the list action answers one envelope, not an array of them
class AuditPageSerializer(serializers.Serializer):
    """What a page of the feed is: its rows, newest first, and where the next (older) page starts."""

    results = AuditEventSerializer(many=True)
    next_before = serializers.IntegerField(
        allow_null=True, help_text="Pass as `before` for the next, older page; null on the last page"
    )


FILTERS = [
    OpenApiParameter(name, OpenApiTypes.DATETIME if name in ("since", "until") else OpenApiTypes.STR)
    for name in AuditFilter.base_fields
]


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """Every audit row, filterable by since, until, kind, agent, person, client, upstream, tool, outcome, error_code,
    request_id and trace_id."""

    queryset = AuditEvent.objects.all()
    serializer_class = AuditEventSerializer

    def get_queryset(self) -> Any:
        return self._of_teams(super().get_queryset())

    def _of_teams(self, rows: Any) -> Any:
        """The rows of the teams the caller audits or administers: another team's row is 404, and absent from
        every page and filter."""
        return audit_of_teams(rows=rows, teams=auditing_teams(user=self.request.user))

    def get_serializer_context(self) -> dict[str, Any]:
        return super().get_serializer_context() | {"auditor": is_auditor(self.request)}

    @extend_schema(parameters=[*FILTERS, PagingSerializer], responses=AuditPageSerializer)
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        form = AuditFilter(request.query_params)
        if not form.is_valid():
            raise ValidationError(form.errors)
        paging = PagingSerializer(data=request.query_params)
        paging.is_valid(raise_exception=True)
        page = audit_page(rows=self._of_teams(form.events()), **paging.validated_data)
        rows = self.get_serializer(page.rows, many=True).data
        return Response({"results": rows, "next_before": page.older})
