from django.contrib import admin, messages
from django.http import HttpRequest

from policy.models import Agent, AgentKey, ServerGroup
from policy.services import agent_key_issue, group_set_enabled


@admin.register(ServerGroup)
class ServerGroupAdmin(admin.ModelAdmin):
    list_display = ("name", "isolation", "enabled")
    list_filter = ("isolation", "enabled")
    actions = ("enable", "disable")

    def _set_enabled(self, request: HttpRequest, queryset, enabled: bool) -> None:
        for group in queryset:
            group_set_enabled(group=group, enabled=enabled, actor=request.user.get_username())
        self.message_user(request, f"{queryset.count()} group(s) {'enabled' if enabled else 'disabled'}.")

    @admin.action(description="Enable selected groups")
    def enable(self, request, queryset):
        self._set_enabled(request, queryset, True)

    @admin.action(description="Disable selected groups")
    def disable(self, request, queryset):
        self._set_enabled(request, queryset, False)


class AgentKeyInline(admin.TabularInline):
    model = AgentKey
    fields = ("prefix", "label", "revoked", "created_at")
    readonly_fields = ("prefix", "created_at")
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # keys are issued by the "Issue a new API key" action, which shows the key once


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ("name", "enabled", "created_at")
    list_filter = ("enabled",)
    inlines = (AgentKeyInline,)
    actions = ("issue_key",)

    def save_model(self, request, obj, form, change) -> None:
        super().save_model(request, obj, form, change)
        if not change:
            issued = agent_key_issue(agent=obj, actor=request.user.get_username())
            self.message_user(
                request, f"API key for {obj.name} (shown once, copy it now): {issued.key}", messages.WARNING
            )

    @admin.action(description="Issue a new API key (shown once)")
    def issue_key(self, request, queryset):
        for agent in queryset:
            issued = agent_key_issue(agent=agent, actor=request.user.get_username())
            self.message_user(request, f"API key for {agent.name} (shown once): {issued.key}", messages.WARNING)
