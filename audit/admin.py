from django.contrib import admin

from audit.models import AuditEvent


class ReadOnlyAdminMixin:
    """Rows the gateway writes and an operator only reads (actions may still act on them)."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only: the trail is appended to by the gateway and never edited by hand."""

    list_display = (
        "id",
        "created_at",
        "kind",
        "action",
        "agent_name",
        "upstream",
        "tool",
        "outcome",
        "error_code",
        "duration_ms",
        "request_id",
    )
    list_filter = ("kind", "outcome", "upstream")
    search_fields = ("=request_id", "agent_name", "tool", "error_code")
    show_full_result_count = False  # no COUNT(*) over a large trail on every page

    @admin.display(description="Action")
    def action(self, event: AuditEvent) -> str:
        """What an admin change did (upstream_disabled, agent_key_issued, ...); blank for calls."""
        return event.detail.get("action", "")
