from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.db.models import Model
from django.http import Http404, HttpRequest
from django.template.response import TemplateResponse
from django.urls import path

from handoff.explain import ExplainRefused, call_explain
from policy.builtin_agents import agent_label, builtin_description
from policy.models import (
    AdminToken,
    Agent,
    AgentGroup,
    AgentKey,
    IdentityProvider,
    Person,
    Rule,
    ServerGroup,
    Team,
    TeamGroup,
    TeamMember,
)
from policy.selectors import admin_teams, in_teams, team_choices
from policy.services import (
    TeamRefused,
    admin_token_revoke,
    agent_key_issue,
    agent_key_revoke,
    group_set_enabled,
    policy_object_delete,
    policy_object_save,
    relations_record,
    rule_save,
)
from registry.services import team_delete


class AgentPickerMixin:
    """Agent pickers that label the built-in agents (policy/builtin_agents.py), which a rule may name."""

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        field = super().formfield_for_foreignkey(db_field, request, **kwargs)
        if db_field.related_model is Agent:
            field.label_from_instance = agent_label
        return field

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        field = super().formfield_for_manytomany(db_field, request, **kwargs)
        if db_field.related_model is Agent:
            field.label_from_instance = agent_label
        return field


class TeamRelatedFilter(admin.RelatedFieldListFilter):
    """A list filter on a related object (a group, an upstream, an agent, a team) that names only what the
    account's teams may pick, as the form's choices do (team_choices); every one for a gateway admin."""

    def field_choices(self, field, request, model_admin):
        teams = admin_teams(request)
        if teams is None:
            return super().field_choices(field, request, model_admin)
        related = field.related_model
        allowed = team_choices(related, teams, related._default_manager.all()).values("pk")
        ordering = self.field_admin_ordering(field, request, model_admin)
        return field.get_choices(include_blank=False, limit_choices_to={"pk__in": allowed}, ordering=ordering)


class TeamScopedMixin:
    """A page of what teams own, for a team admin: the list, the change pages and every choice hold only the
    objects of teams where the account is `admin` (docs/teams.md); another team's object by id is 404.
    `team_path` reaches the owning team from the model."""

    team_path = "team"
    team_refused = "You may save only into a team you administer: pick one of yours."

    def get_queryset(self, request):
        return self.team_rows(super().get_queryset(request), admin_teams(request))

    def team_rows(self, rows, teams: frozenset[str] | None):
        """What the account's teams may see of `rows`: their own objects (None: every one)."""
        return in_teams(rows, teams, self.team_path)

    def get_list_filter(self, request):
        return [_team_filter(self.model, entry) for entry in super().get_list_filter(request)]

    def get_object(self, request, object_id, from_field=None):
        obj = super().get_object(request, object_id, from_field)
        if obj is None and admin_teams(request) is not None:
            raise Http404("No such object among your teams'.")
        return obj

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        field = super().formfield_for_foreignkey(db_field, request, **kwargs)
        if field is not None and hasattr(field, "queryset"):
            field.queryset = team_choices(db_field.related_model, admin_teams(request), field.queryset)
            if db_field.related_model is Team:
                field.error_messages["invalid_choice"] = self.team_refused
        return field

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        field = super().formfield_for_manytomany(db_field, request, **kwargs)
        if field is not None and hasattr(field, "queryset") and db_field.related_model is not Team:
            field.queryset = team_choices(db_field.related_model, admin_teams(request), field.queryset)
        return field


def _team_filter(model: type[Model], entry: Any) -> Any:
    """`entry` of a list_filter, with TeamRelatedFilter for a field naming a related object."""
    if isinstance(entry, str) and "__" not in entry and model._meta.get_field(entry).is_relation:
        return (entry, TeamRelatedFilter)
    return entry


class AuditedDeleteMixin:
    """Deletes through `policy_object_delete`, one by one, so every deletion is an audit row."""

    def delete_model(self, request, obj) -> None:
        policy_object_delete(obj=obj, actor=request.user.get_username())

    def delete_queryset(self, request, queryset) -> None:
        for obj in queryset:
            self.delete_model(request, obj)


class AuditedSaveMixin(AuditedDeleteMixin):
    """Saves (and deletes) through the policy services, so every change made in the admin is an audit row;
    `related_action` and `relations` name what the form's many-to-many fields hold after a save."""

    related_action = ""

    def relations(self, obj) -> dict[str, list[str]]:
        return {}

    def save_related(self, request, form, formsets, change) -> None:
        super().save_related(request, form, formsets, change)
        if self.related_action:
            actor = request.user.get_username()
            relations = self.relations(form.instance)
            relations_record(obj=form.instance, actor=actor, action=self.related_action, **relations)

    def save_model(self, request, obj, form, change) -> None:
        policy_object_save(obj=obj, actor=request.user.get_username(), created=not change)


class ExplainForm(forms.Form):
    agent = forms.ModelChoiceField(Agent.objects.all(), to_field_name="name")
    tool = forms.CharField(max_length=300, help_text="As tools/list names it, e.g. demo__add")
    person = forms.CharField(max_length=255, required=False, help_text="A person's subject, for a call made as them")
    issuer = forms.CharField(max_length=255, required=False, help_text="Their issuer, when several share the subject")
    groups = forms.CharField(max_length=512, required=False, help_text="Their groups at the IdP, space-separated")


@admin.register(Rule)
class RuleAdmin(TeamScopedMixin, AgentPickerMixin, AuditedDeleteMixin, admin.ModelAdmin):
    """Deny wins over allow; with no matching rule, GATEWAY_POLICY_DEFAULT decides (see docs/policy.md)."""

    list_display = (
        "effect", "agent", "agent_group", "person", "upstream", "server_group", "tool_pattern", "enabled", "note",
        "team",
    )  # fmt: skip
    fieldsets = (
        (None, {"fields": ("effect", "enabled", "note", "team")}),
        ("Who: empty means anyone", {"fields": ("agent", "agent_group", "person")}),
        ("Where: empty means any upstream", {"fields": ("upstream", "server_group", ("tool_pattern", "tool_class"))}),
        (
            "Sign-off: a sign_off rule only (docs/policy.md)",
            {"fields": ("signers", "four_eyes", ("sign_off_wait", "sign_off_valid"), "sign_off_by_form")},
        ),
    )

    def changelist_view(self, request, extra_context=None):
        stance = {"stance": settings.GATEWAY_POLICY_DEFAULT}  # the template says what it means
        return super().changelist_view(request, (extra_context or {}) | stance)

    list_filter = ("effect", "enabled", "team", "agent", "upstream", "server_group")
    search_fields = ("tool_pattern", "note")

    def save_model(self, request, obj, form, change) -> None:
        rule_save(rule=obj, actor=request.user.get_username(), created=not change)

    def get_urls(self):
        explain = path("explain/", self.admin_site.admin_view(self.explain_view), name="policy_rule_explain")
        return [explain, *super().get_urls()]

    def explain_view(self, request: HttpRequest) -> TemplateResponse:
        """Can this caller call this tool, and why: the answer of handoff/explain.py, as the API gives it."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = ExplainForm(request.GET if "tool" in request.GET else None)
        agents = form.fields["agent"]
        agents.queryset = team_choices(Agent, admin_teams(request), agents.queryset)  # another team's: 400
        context = self.admin_site.each_context(request) | {"opts": self.opts, "title": "Can this caller call it?"}
        status, explained = 200, None
        if form.is_bound and form.is_valid():
            asked = form.cleaned_data
            try:
                explained = call_explain(
                    agent=asked["agent"].name,
                    tool=asked["tool"],
                    person=asked["person"],
                    issuer=asked["issuer"],
                    groups=tuple(asked["groups"].split()),
                )
            except ExplainRefused as refused:
                form.add_error(None, str(refused))
        if form.errors:
            status = 400
        page = context | {"form": form, "explained": explained, "stance": settings.GATEWAY_POLICY_DEFAULT}
        return TemplateResponse(request, "admin/policy/rule/explain.html", page, status=status)


@admin.register(AgentGroup)
class AgentGroupAdmin(TeamScopedMixin, AgentPickerMixin, AuditedSaveMixin, admin.ModelAdmin):
    list_display = ("name", "team", "idp_groups")
    list_filter = ("team",)
    filter_horizontal = ("agents",)

    related_action = "agentgroup_members"

    def relations(self, group: AgentGroup) -> dict[str, list[str]]:
        return {"members": group.agents.values_list("name", flat=True)}


@admin.register(ServerGroup)
class ServerGroupAdmin(TeamScopedMixin, AuditedSaveMixin, admin.ModelAdmin):
    list_display = ("name", "team", "isolation", "enabled", "upstream_list")
    list_filter = ("isolation", "enabled", "team")
    actions = ("enable", "disable")

    def _set_enabled(self, request: HttpRequest, queryset, enabled: bool) -> None:
        for group in queryset:
            group_set_enabled(group=group, enabled=enabled, actor=request.user.get_username())
        self.message_user(request, f"{queryset.count()} group(s) {'enabled' if enabled else 'disabled'}.")

    @admin.display(description="Upstreams")
    def upstream_list(self, group: ServerGroup) -> str:
        return ", ".join(upstream.slug for upstream in group.upstreams.all()) or "—"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("team").prefetch_related("upstreams")

    @admin.action(description="Enable selected groups")
    def enable(self, request, queryset):
        self._set_enabled(request, queryset, True)

    @admin.action(description="Disable selected groups")
    def disable(self, request, queryset):
        self._set_enabled(request, queryset, False)


class AgentKeyInline(admin.TabularInline):
    model = AgentKey
    fields = (
        "prefix",
        "label",
        "owner",
        "tools",
        "expires_at",
        "revoked",
        "created_at",
        "last_used_at",
        "last_used_from",
    )
    readonly_fields = ("prefix", "created_at", "last_used_at", "last_used_from")
    raw_id_fields = ("owner",)
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # keys are issued by the "Issue a new API key" action, which shows the key once


@admin.register(Agent)
class AgentAdmin(TeamScopedMixin, AuditedSaveMixin, admin.ModelAdmin):
    list_display = ("name", "team", "enabled", "calls_per_minute", "max_calls_per_session", "created_at", "built_in")
    list_filter = ("enabled", "team", "agent_groups")
    readonly_fields = ("built_in",)
    inlines = (AgentKeyInline,)
    actions = ("issue_key",)

    @admin.display(description="Built in")
    def built_in(self, agent: Agent) -> str:
        return builtin_description(agent.name) or "—"

    def save_model(self, request, obj, form, change) -> None:
        super().save_model(request, obj, form, change)  # audited (AuditedSaveMixin)
        if not change:
            issued = agent_key_issue(agent=obj, actor=request.user.get_username())
            self.message_user(
                request, f"API key for {obj.name} (shown once, copy it now): {issued.key}", messages.WARNING
            )

    def save_formset(self, request, form, formset, change) -> None:
        """Key edits go through the services: a revocation is audited, a new label too."""
        if formset.model is not AgentKey:
            return super().save_formset(request, form, formset, change)
        actor = request.user.get_username()
        formset.save(commit=False)  # fills changed_objects (and what the admin's history reads), saves nothing
        for key, changed in formset.changed_objects:
            if "revoked" in changed and key.revoked:
                agent_key_revoke(prefix=key.prefix, actor=actor)
            if {"label", "owner", "tools", "expires_at"} & set(changed):
                policy_object_save(obj=key, actor=actor, created=False)

    @admin.action(description="Issue a new API key (shown once)")
    def issue_key(self, request, queryset):
        for agent in queryset:
            issued = agent_key_issue(agent=agent, actor=request.user.get_username())
            self.message_user(request, f"API key for {agent.name} (shown once): {issued.key}", messages.WARNING)


@admin.register(AdminToken)
class AdminTokenAdmin(admin.ModelAdmin):
    """REST API tokens: issued with `manage.py admin_token <user>` (shown once), revoked here."""

    list_display = ("__str__", "user", "label", "revoked", "created_at", "last_used_at")
    list_filter = ("revoked",)
    fields = list_display
    readonly_fields = list_display
    actions = ("revoke",)

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        for token in queryset.select_related("user"):
            admin_token_revoke(token=token, actor=request.user.get_username())
        self.message_user(request, f"{queryset.count()} token(s) revoked.")


def _permission_names(permissions) -> list[str]:
    return [f"{p.content_type.app_label}.{p.codename}" for p in permissions.select_related("content_type")]


# The console's own operators: who may do what in it is an admin change like any other.
admin.site.unregister(get_user_model())
admin.site.unregister(Group)


@admin.register(get_user_model())
class OperatorAdmin(AuditedSaveMixin, UserAdmin):
    related_action = "user_access"

    def relations(self, user) -> dict[str, list[str]]:
        return {
            "groups": user.groups.values_list("name", flat=True),
            "permissions": _permission_names(user.user_permissions),
        }


@admin.register(Group)
class OperatorGroupAdmin(AuditedSaveMixin, GroupAdmin):
    related_action = "group_access"

    def relations(self, group: Group) -> dict[str, list[str]]:
        return {"permissions": _permission_names(group.permissions)}


@admin.register(IdentityProvider)
class IdentityProviderAdmin(AuditedSaveMixin, admin.ModelAdmin):
    """OIDC issuers whose access tokens sign people in (docs/identity.md)."""

    list_display = ("name", "issuer", "agent", "audience", "scopes", "enabled")
    list_filter = ("enabled",)


@admin.register(Person)
class PersonAdmin(AuditedSaveMixin, admin.ModelAdmin):
    """People tokens named, made on first sight; a disabled one is refused on their next call."""

    list_display = ("__str__", "subject", "issuer", "enabled", "first_seen", "last_seen")
    list_filter = ("enabled", "issuer")
    search_fields = ("name", "subject")
    readonly_fields = ("first_seen", "last_seen")


class GatewayAdminOnly:
    """Pages only a gateway admin (a superuser) opens: every team's group mappings in one list (a team's admin
    manages its own on the team's page)."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_view_permission(self, request: HttpRequest, obj=None) -> bool:
        return self.has_module_permission(request)

    has_add_permission = has_change_permission = has_delete_permission = has_view_permission


def manages_team(request: HttpRequest, team: Team | None) -> bool:
    """A gateway admin manages every team; a team's `admin` its own members and group mappings (team None:
    any team of its own)."""
    teams = admin_teams(request)
    if teams is None:
        return request.user.is_active and request.user.is_superuser
    return request.user.is_active and request.user.is_staff and (team.slug in teams if team else bool(teams))


class TeamMembersOnly:
    """A team's people, on its page: changed by whoever manages the team (manages_team)."""

    extra = 0

    def has_view_permission(self, request: HttpRequest, obj=None) -> bool:
        return manages_team(request, obj)

    has_add_permission = has_change_permission = has_delete_permission = has_view_permission


class TeamMemberInline(TeamMembersOnly, admin.TabularInline):
    model = TeamMember
    raw_id_fields = ("user",)


class TeamGroupInline(TeamMembersOnly, admin.TabularInline):
    model = TeamGroup


@admin.register(Team)
class TeamAdmin(AuditedSaveMixin, admin.ModelAdmin):
    """Teams own upstreams, agents, groups, rules and routes (docs/teams.md); a team that owns anything, or
    shares an upstream, is not deleted. A gateway admin makes and changes teams; a team's `admin` opens its
    own team's page to manage its members and group mappings, not its name or limits."""

    list_display = ("slug", "name", "calls_per_minute", "max_concurrent", "daily_calls", "created_at")
    search_fields = ("slug", "name")
    fieldsets = (
        (None, {"fields": ("slug", "name")}),
        ("Limits, all the team's agents together: empty means the deployment's default", {
            "fields": ("calls_per_minute", "max_concurrent", "daily_calls"),
        }),
    )  # fmt: skip
    inlines = (TeamMemberInline, TeamGroupInline)
    related_action = "team_members"

    def relations(self, team: Team) -> dict[str, list[str]]:
        members = team.members.select_related("user")
        return {
            "members": [f"{m.user.get_username()}: {m.role}" for m in members],
            "groups": [f"{g.group}: {g.role}" for g in team.idp_groups.all()],
        }

    def has_module_permission(self, request: HttpRequest) -> bool:
        return manages_team(request, None)

    def has_view_permission(self, request: HttpRequest, obj=None) -> bool:
        return manages_team(request, obj)

    has_change_permission = has_view_permission

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return self.has_add_permission(request)

    def get_readonly_fields(self, request: HttpRequest, obj=None):
        if admin_teams(request) is None:
            return ()
        return ("slug", "name", "calls_per_minute", "max_concurrent", "daily_calls")

    def get_queryset(self, request: HttpRequest):
        return team_choices(Team, admin_teams(request), super().get_queryset(request))

    def get_object(self, request, object_id, from_field=None):
        obj = super().get_object(request, object_id, from_field)
        if obj is None and admin_teams(request) is not None:
            raise Http404("No such team among yours.")
        return obj

    def delete_model(self, request, obj) -> None:
        try:
            team_delete(team=obj, actor=request.user.get_username())
        except TeamRefused as refused:
            self.message_user(request, refused.message, messages.ERROR)


@admin.register(TeamGroup)
class TeamGroupAdmin(GatewayAdminOnly, AuditedSaveMixin, admin.ModelAdmin):
    """IdP groups (or console groups, for the built-in sign-in) whose people have a role in a team."""

    list_display = ("group", "team", "role")
    list_filter = ("team", "role")
    search_fields = ("group",)
