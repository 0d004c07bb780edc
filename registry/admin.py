from django.contrib import admin, messages

from registry.forms import UpstreamForm
from registry.models import Tool, Upstream
from registry.services import upstream_catalog_sync, upstream_save, upstream_set_enabled


class ToolInline(admin.TabularInline):
    model = Tool
    fields = ("name", "title", "definition_sha256", "first_seen_at", "last_seen_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Upstream)
class UpstreamAdmin(admin.ModelAdmin):
    form = UpstreamForm
    list_display = ("slug", "transport", "group", "enabled", "timeout", "last_synced_at", "last_sync_error")
    list_filter = ("transport", "enabled", "group")
    search_fields = ("slug", "name")
    readonly_fields = ("revision", "last_synced_at", "last_sync_error")
    inlines = (ToolInline,)
    actions = ("enable", "disable", "sync_catalog")

    def save_model(self, request, obj, form, change) -> None:
        upstream_save(upstream=obj, actor=request.user.get_username(), created=not change)

    def response_post_save_add(self, request, obj):
        self._sync(request, [obj])
        return super().response_post_save_add(request, obj)

    def response_post_save_change(self, request, obj):
        self._sync(request, [obj])
        return super().response_post_save_change(request, obj)

    def _sync(self, request, upstreams) -> None:
        for upstream in upstreams:
            if not upstream.enabled:
                continue
            report = upstream_catalog_sync(upstream=upstream)
            self.message_user(request, report.summary(), messages.SUCCESS if report.ok else messages.ERROR)

    @admin.action(description="Enable selected upstreams (and sync their tools)")
    def enable(self, request, queryset):
        for upstream in queryset:
            upstream_set_enabled(upstream=upstream, enabled=True, actor=request.user.get_username())
        self._sync(request, list(queryset))

    @admin.action(description="Disable selected upstreams")
    def disable(self, request, queryset):
        for upstream in queryset:
            upstream_set_enabled(upstream=upstream, enabled=False, actor=request.user.get_username())
        self.message_user(request, f"{queryset.count()} upstream(s) disabled.")

    @admin.action(description="Sync tool catalog now")
    def sync_catalog(self, request, queryset):
        self._sync(request, list(queryset))


@admin.register(Tool)
class ToolAdmin(admin.ModelAdmin):
    list_display = ("name", "upstream", "title", "definition_sha256", "last_seen_at")
    list_filter = ("upstream",)
    search_fields = ("name", "description")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
