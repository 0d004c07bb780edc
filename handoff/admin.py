from asgiref.sync import async_to_sync
from django.contrib import admin
from django.db.models import Case, Value, When

from audit.admin import ReadOnlyAdminMixin
from handoff.mcp.list_changed import tools_changed_everywhere
from handoff.models import HandoffRoute, Tunnel
from handoff.protocol.tunnels import index_session, tunnel_close_out
from policy.admin import AuditedSaveMixin, TeamScopedMixin


@admin.register(HandoffRoute)
class HandoffRouteAdmin(TeamScopedMixin, AuditedSaveMixin, admin.ModelAdmin):
    list_display = ("domain", "target", "team", "enabled", "max_sessions", "idle_timeout")
    list_filter = ("enabled", "team")
    search_fields = ("domain", "description")


@admin.register(Tunnel)
class TunnelAdmin(TeamScopedMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Live tunnels first; read-only, but an operator can close one (the agent's tools come back). A team's
    admin sees its own agents' tunnels."""

    team_path = "agent__team"

    list_display = (
        "domain",
        "agent",
        "session_key",
        "upstream",
        "state",
        "opened_at",
        "last_used_at",
        "worker_queue",
        "close_reason",
    )
    list_filter = ("state", "domain")
    actions = ("close",)

    def get_queryset(self, request):
        live = Case(When(state__in=Tunnel.LIVE, then=Value(0)), default=Value(1))
        return (
            super()
            .get_queryset(request)
            .select_related("agent", "upstream")
            .alias(live=live)
            .order_by("live", "-opened_at")
        )

    def has_close_permission(self, request) -> bool:
        return request.user.has_perm("handoff.change_tunnel")

    @admin.action(description="Close selected tunnels", permissions=["close"])
    def close(self, request, queryset):
        closed = [
            t
            for t in queryset.select_related("upstream")
            if tunnel_close_out(t, "closed by operator", actor=request.user.get_username())
        ]
        async_to_sync(tools_changed_everywhere)([index_session(t.agent_id, t.session_key) for t in closed])
        self.message_user(request, f"{len(closed)} tunnel(s) closed.")
