import difflib
import json
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.handlers.asgi import ASGIRequest
from django.db import transaction
from django.db.models import BooleanField, ExpressionWrapper, F, Q, Value
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.defaultfilters import truncatechars
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.text import Truncator

from handoff.console import CONSOLE_AGENT, console_agent, console_call_from_sync
from policy.admin import AuditedSaveMixin, TeamScopedMixin
from policy.limits.stores import limit_store
from policy.manifest import manifest_sanitize
from policy.selectors import admin_teams, in_teams, team_choices
from registry.forms import LocalPrefixForm, UpstreamForm
from registry.models import LocalPrefix, PersonalCredential, PinnedItem, Tool, Upstream, VirtualServer
from registry.naming import exposed_name
from registry.overrides import OverrideRefused, override_check, override_json
from registry.package_pins import package_approve, package_update
from registry.personal import personal_revoke
from registry.pinned_items import pinned_item_approve
from registry.server_override_admin import ServerOverridesMixin
from registry.services import (
    local_prefix_set,
    tool_approve,
    tool_override_clear,
    tool_override_set,
    upstream_breaker_reset,
    upstream_catalog_sync,
    upstream_delete,
    upstream_register,
    upstream_save,
    upstream_set_enabled,
)
from registry.tool_form import ToolArgumentsForm, arguments_parse
from registry.upstreams.packages import PackageProblem


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _json_or_refused(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"Not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}.") from None


def definition_diff(pin: Tool | PinnedItem) -> str:
    """The change waiting for approval, as a unified diff of the two definitions."""
    before, now = pretty(pin.approved_definition or {}).splitlines(), pretty(pin.definition).splitlines()
    return "\n".join(difflib.unified_diff(before, now, "approved", "offered now", lineterm=""))


@admin.display(boolean=True, description="approved")
def approved(pin: Tool | PinnedItem) -> bool:
    return pin.is_approved


class PendingFilter(admin.SimpleListFilter):
    title = "approval"
    parameter_name = "approval"

    def lookups(self, request, model_admin):
        return [("pending", "Waiting for approval"), ("approved", "Approved")]

    def queryset(self, request, queryset):
        if self.value() == "pending":
            return queryset.exclude(approved_sha256=F("definition_sha256"))
        if self.value() == "approved":
            return queryset.filter(approved_sha256=F("definition_sha256"))
        return queryset


class ToolInline(admin.TabularInline):
    model = Tool
    fields = ("name", "title", approved, "definition_sha256", "first_seen_at", "last_seen_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class BorrowedToolInline(ToolInline):
    show_change_link = False  # a shared upstream's tools are its owner's to open and approve


CAUSE_SHOWN = 120  # characters of a failing upstream's cause in the list

# What a team admin sees of an upstream another team shares with its teams: what its agents call, how it is
# doing; never how it is reached (command, URL, headers, credentials) nor whom else it is shared with.
BORROWED_FIELDS = (
    "slug", "name", "team", "transport", "enabled", "health_status", "health_cause", "health_checked_at", "circuit",
    "protocol_version", "instructions", "timeout", "per_person", "prefixed", "handoff_only", "last_synced_at",
)  # fmt: skip


@admin.register(Upstream)
class UpstreamAdmin(TeamScopedMixin, admin.ModelAdmin):
    form = UpstreamForm
    list_display = (
        "slug",
        "team",
        "health_status",
        "transport",
        "own_group",
        "enabled",
        "per_person",
        "prefixed",
        "handoff_only",
        "protocol_version",
        "circuit",
        "timeout",
        "last_synced_at",
        "last_sync_error",
    )
    list_filter = ("health", "transport", "enabled", "per_person", "prefixed", "handoff_only", "group", "team")
    list_select_related = ("team", "group")
    search_fields = ("slug", "name")
    readonly_fields = (
        "health_status",
        "health_cause",
        "health_checked_at",
        "circuit",
        "revision",
        "last_synced_at",
        "last_sync_error",
        "protocol_version",
        "instructions",
        "package_status",
    )
    inlines = (ToolInline,)
    filter_horizontal = ("shared_with",)
    actions = ("enable", "disable", "sync_catalog", "close_circuit", "update_packages", "approve_packages")

    def team_rows(self, rows, teams: frozenset[str] | None):
        """Its teams' upstreams and those shared with them, these marked `borrowed`: listed and shown read-only
        (docs/teams.md), never changed, deleted or acted on by a borrower."""
        if teams is None:
            return rows.annotate(borrowed=Value(False))
        borrowed = ExpressionWrapper(~Q(team__slug__in=teams), output_field=BooleanField())
        return team_choices(Upstream, teams, rows).annotate(borrowed=borrowed)

    def is_borrowed(self, request: HttpRequest, upstream: Upstream | None) -> bool:
        teams = admin_teams(request)
        return upstream is not None and teams is not None and upstream.team.slug not in teams

    def has_change_permission(self, request: HttpRequest, obj: Upstream | None = None) -> bool:
        return super().has_change_permission(request, obj) and not self.is_borrowed(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Upstream | None = None) -> bool:
        return super().has_delete_permission(request, obj) and not self.is_borrowed(request, obj)

    def get_fieldsets(self, request: HttpRequest, obj: Upstream | None = None):
        if self.is_borrowed(request, obj):
            return [(None, {"fields": BORROWED_FIELDS})]
        return super().get_fieldsets(request, obj)

    def get_inlines(self, request: HttpRequest, obj: Upstream | None):
        return (BorrowedToolInline,) if self.is_borrowed(request, obj) else super().get_inlines(request, obj)

    def history_view(self, request, object_id, extra_context=None):
        if self.is_borrowed(request, self.get_object(request, object_id)):
            raise PermissionDenied  # who changed it, and how, is its owner's
        return super().history_view(request, object_id, extra_context)

    def response_action(self, request, queryset):
        return super().response_action(request, in_teams(queryset, admin_teams(request)))

    @admin.display(description="Group", ordering="group")
    def own_group(self, upstream: Upstream) -> str:
        """Its server group, unless another team's: a borrower sees the upstream, not how its owner groups it."""
        return "-" if getattr(upstream, "borrowed", False) or upstream.group is None else str(upstream.group)

    @admin.display(description="Package")
    def package_status(self, upstream: Upstream) -> str:
        """An npx or uvx server's pinned package and one held for approval, by name, version and integrity."""
        said = {state: "{name} {version} ({integrity})".format(**pin) for state, pin in upstream.package.items()}
        held = f"; held for approval: {said['held']}" if "held" in said else ""
        return f"{said['pinned']}{held}" if "pinned" in said else "-"

    @admin.action(description="Install the npx or uvx packages of selected upstreams again (a changed one is held)")
    def update_packages(self, request, queryset):
        self._packages(request, queryset, package_update)

    @admin.action(description="Approve the held packages of selected upstreams")
    def approve_packages(self, request, queryset):
        self._packages(request, queryset, package_approve)

    def _packages(self, request, queryset, step) -> None:
        for upstream in queryset:
            try:
                said = step(upstream=upstream, actor=request.user.get_username())
            except PackageProblem as exc:
                self.message_user(request, str(exc), messages.ERROR)
            else:
                self.message_user(request, f"{upstream.slug}: {said}", messages.SUCCESS)

    @admin.display(description="Health", ordering="health")
    def health_status(self, upstream: Upstream) -> str:
        """Its state and, when failing, why (the last sync, call or probe): the operator's words, not the model's."""
        if upstream.health != Upstream.Health.FAILING:
            return upstream.get_health_display()
        cause = upstream.health_cause or "unknown cause"
        # The list stays narrow enough to show this column at 1400 px; the whole cause is its title and on the page.
        shown = Truncator(cause).chars(CAUSE_SHOWN)
        return format_html('<span class="health-failing" title="{}">failing: {}</span>', cause, shown)

    @admin.display(description="Circuit")
    def circuit(self, upstream: Upstream) -> str:
        status = limit_store().breaker(upstream.id)
        if status.state == "open":
            return f"open ({status.failures} failures; probe in {status.retry_after:.0f} s)"
        return status.state if not status.failures else f"{status.state} ({status.failures} failures)"

    @admin.action(description="Close the circuit of selected upstreams")
    def close_circuit(self, request, queryset):
        for upstream in queryset:
            upstream_breaker_reset(upstream=upstream, actor=request.user.get_username())
        self.message_user(request, f"{queryset.count()} circuit(s) closed.")

    def save_model(self, request, obj, form, change) -> None:
        upstream_save(upstream=obj, actor=request.user.get_username(), created=not change)

    def delete_model(self, request, obj) -> None:
        upstream_delete(upstream=obj, actor=request.user.get_username())

    def delete_queryset(self, request, queryset) -> None:
        for upstream in queryset:
            self.delete_model(request, upstream)

    def response_post_save_add(self, request, obj):
        # A REST upstream whose document is refused is removed again (upstream_register): the page says why.
        transaction.on_commit(lambda: self._register(request, obj))
        return super().response_post_save_add(request, obj)

    def _register(self, request, upstream: Upstream) -> None:
        if upstream.enabled:
            report = upstream_register(upstream=upstream, actor=request.user.get_username())
            self.message_user(request, report.summary(), messages.SUCCESS if report.ok else messages.ERROR)

    def response_post_save_change(self, request, obj):
        self._sync_after_commit(request, obj)
        return super().response_post_save_change(request, obj)

    def _sync_after_commit(self, request, upstream: Upstream) -> None:
        # The admin saves inside a transaction; the executor reads the upstream through another connection
        # (or process), which would find the row as it was before the save, or none.
        transaction.on_commit(lambda: self._sync(request, [upstream]))

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


class PinAdmin(TeamScopedMixin, admin.ModelAdmin):
    """What an upstream says, pinned (a tool, or a resource, prompt or instructions): offered as approved; a
    changed definition waits until an administrator reviews the diff and approves it (`approve`, below)."""

    team_path = "upstream__team"
    list_filter = (PendingFilter, "upstream")
    change_form_template = "admin/registry/pin_change_form.html"
    actions = ("approve",)
    approve_service: Any  # (pin=..., actor=...): pins the current definition

    def get_urls(self):
        name = f"registry_{self.opts.model_name}_approve"
        approve = path("<int:pk>/approve/", self.admin_site.admin_view(self.approve_view), name=name)
        return [approve, *super().get_urls()]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        pin = self.get_object(request, object_id)
        approvable = bool(pin and not pin.is_approved and self.has_approve_permission(request))
        approve_url = reverse(f"admin:registry_{self.opts.model_name}_approve", args=[object_id]) if pin else ""
        extra = (extra_context or {}) | {"approvable": approvable, "approve_url": approve_url}
        return super().change_view(request, object_id, form_url, extra)

    def approve_view(self, request, pk: int):
        """POST from the pin's page: approve the definition shown there."""
        if request.method != "POST" or not self.has_approve_permission(request):
            raise PermissionDenied
        pin = get_object_or_404(self.get_queryset(request).select_related("upstream"), pk=pk)
        if not pin.is_approved:
            self.approve_service(pin, actor=request.user.get_username())
            self.message_user(request, f"{pin} approved: agents see this version now.", messages.SUCCESS)
        return redirect(f"admin:registry_{self.opts.model_name}_change", pk)

    @admin.display(description="Change waiting for approval")
    def pending_change(self, pin: Tool | PinnedItem) -> str:
        if pin.is_approved:
            return "None: the offered definition is the approved one."
        return format_html("<pre>{}</pre>", definition_diff(pin))

    @admin.display(description="Definition")
    def pretty_definition(self, pin: Tool | PinnedItem) -> str:
        return format_html("<pre>{}</pre>", pretty(pin.definition))

    @admin.action(description="Approve the current definition of the selected", permissions=["approve"])
    def approve(self, request, queryset):
        pending = [pin for pin in queryset.select_related("upstream") if not pin.is_approved]
        for pin in pending:
            self.approve_service(pin, actor=request.user.get_username())
        self.message_user(request, f"{len(pending)} version(s) approved.")

    def has_approve_permission(self, request) -> bool:
        return request.user.has_perm(f"registry.change_{self.opts.model_name}")

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # catalog sync removes what an upstream stops listing

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # the catalog is what upstreams say; an administrator approves it, never edits it


@admin.register(Tool)
class ToolAdmin(PinAdmin):
    """The catalog. A tool whose definition changed since its approval is offered to no agent until an
    administrator reviews the diff and approves it."""

    list_display = ("name", "upstream", approved, "title", "summary", "last_seen_at")
    search_fields = ("name", "description")
    fields = (
        "pending_change", "upstream", "name", "title", "description", "overridden", "pretty_definition",
        "definition_sha256", "approved_sha256", "approved_by", "approved_at", "first_seen_at", "last_seen_at",
    )  # fmt: skip
    readonly_fields = fields

    @staticmethod
    def approve_service(tool: Tool, *, actor: str) -> None:
        tool_approve(tool=tool, actor=actor)

    def get_urls(self):
        test = path("<int:pk>/test/", self.admin_site.admin_view(self.test_view), name="registry_tool_test")
        override = path(
            "<int:pk>/override/", self.admin_site.admin_view(self.override_view), name="registry_tool_override"
        )
        return [test, override, *super().get_urls()]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        tool = self.get_object(request, object_id)
        testable = bool(tool and self.has_test_permission(request))  # a held tool's page says why it is refused
        extra = (extra_context or {}) | {"testable": testable, "overridable": bool(tool)}
        return super().change_view(request, object_id, form_url, extra)

    def test_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """Test this tool: the form its schema makes, a confirmation, then the call as an agent's would run."""
        if not self.has_test_permission(request):
            raise PermissionDenied
        tool = get_object_or_404(self.get_queryset(request).select_related("upstream", "override"), pk=pk)
        schema = tool.shown_definition().get("inputSchema")
        page = {"tool": tool, "exposed": exposed_name(tool.upstream.namespace, tool.own_name), "agent": CONSOLE_AGENT}
        if not tool.is_approved:
            return self._test_page(request, page | {"stage": "held"}, status=409 if request.method == "POST" else 200)
        if request.method != "POST":
            return self._test_page(request, page | {"stage": "form", "form": ToolArgumentsForm(schema)})
        if "confirmed" not in request.POST:
            form = ToolArgumentsForm(schema, request.POST)
            if not form.is_valid():
                return self._test_page(request, page | {"stage": "form", "form": form}, status=400)
            return self._test_page(request, page | {"stage": "confirm", "arguments": pretty(form.arguments())})
        try:
            arguments = arguments_parse(request.POST.get("arguments", ""))
        except ValidationError as invalid:
            form = ToolArgumentsForm(schema)
            return self._test_page(request, page | {"stage": "form", "form": form, "invalid": invalid.message}, 400)
        operator = request.user.get_username()
        agent_id, version = console_agent(actor=operator)
        call = console_call_from_sync(
            own_loop=not isinstance(request, ASGIRequest),
            agent_id=agent_id,
            version=version,
            operator=operator,
            name=page["exposed"],
            arguments=arguments,
        )
        shown = pretty(call.result) if call.result is not None else ""
        return self._test_page(request, page | {"stage": "result", "call": call, "shown": shown})

    def override_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """How agents see the tool: its override as JSON (docs/curation.md), saved or cleared through the service."""
        tool = get_object_or_404(self.get_queryset(request).select_related("upstream", "override"), pk=pk)
        editable = self.has_approve_permission(request)
        if request.method == "POST" and not editable:
            raise PermissionDenied
        row = getattr(tool, "override", None)
        page = {"tool": tool, "editable": editable, "text": pretty(override_json(row.value()) if row else {})}
        if request.method == "POST":
            actor, page["text"] = request.user.get_username(), request.POST.get("override", "")
            try:
                if "clear" in request.POST:
                    tool_override_clear(tool=tool, actor=actor)
                else:
                    tool_override_set(tool=tool, data=_json_or_refused(page["text"]), actor=actor)
            except ValidationError as refused:
                return self._override_page(request, page | {"error": " ".join(refused.messages)}, status=400)
            self.message_user(request, f"{tool}: agents see the change within seconds.", messages.SUCCESS)
            return redirect("admin:registry_tool_change", pk)
        return self._override_page(request, page)

    def _override_page(self, request: HttpRequest, context: dict[str, Any], status: int = 200) -> TemplateResponse:
        tool = context["tool"]
        shown = manifest_sanitize(tool.shown_definition()) | {
            "name": exposed_name(tool.upstream.namespace, tool.own_name)
        }
        context |= self.admin_site.each_context(request) | {"opts": self.opts, "title": f"Override {tool}"}
        context |= {"shown": pretty(shown)}
        return TemplateResponse(request, "admin/registry/tool/override.html", context, status=status)

    def _test_page(self, request: HttpRequest, context: dict[str, Any], status: int = 200) -> TemplateResponse:
        context |= self.admin_site.each_context(request) | {"opts": self.opts, "title": f"Test {context['tool']}"}
        return TemplateResponse(request, "admin/registry/tool/test.html", context, status=status)

    def has_test_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("registry.change_tool")

    @admin.display(description="Description")
    def summary(self, tool: Tool) -> str:
        return truncatechars(tool.description, 120)

    @admin.display(description="Override")
    def overridden(self, tool: Tool) -> str:
        row = getattr(tool, "override", None)
        if row is None:
            return "None: agents see the tool as the upstream lists it."
        shown = format_html('<pre id="tool-override">{}</pre>', pretty(override_json(row.value())))
        try:  # an approved change of the upstream's definition may leave the override behind
            override_check(row.value(), tool.definition)
        except OverrideRefused as stale:
            return format_html('<p class="errornote" id="tool-override-stale">No longer fits: {}</p>{}', stale, shown)
        return shown


@admin.register(PinnedItem)
class PinnedItemAdmin(PinAdmin):
    """Resources, resource templates, prompts and instructions of each upstream, pinned as tools are: agents get
    the approved copy while a changed one waits here (registry/pinned_items.py)."""

    list_display = ("__str__", "kind", "upstream", approved, "last_seen_at")  # instructions have no key
    list_filter = (PendingFilter, "kind", "upstream")
    search_fields = ("key",)
    fields = (
        "pending_change", "upstream", "kind", "key", "pretty_definition", "definition_sha256", "approved_sha256",
        "approved_by", "approved_at", "first_seen_at", "last_seen_at",
    )  # fmt: skip
    readonly_fields = fields

    @staticmethod
    def approve_service(item: PinnedItem, *, actor: str) -> None:
        pinned_item_approve(item=item, actor=actor)


@admin.register(PersonalCredential)
class PersonalCredentialAdmin(TeamScopedMixin, admin.ModelAdmin):
    """Who has connected what, and since when: never a value (those are sealed in the secret store)."""

    team_path = "upstream__team"
    list_display = (
        "upstream",
        "person_name",
        "person_subject",
        "kind",
        "connected_at",
        "expires_at",
        "last_used_at",
        "state",
    )
    list_filter = ("upstream", "kind")
    search_fields = ("person_name", "person_subject", "upstream__slug")
    readonly_fields = [field.name for field in PersonalCredential._meta.fields]
    actions = ("revoke",)

    def has_add_permission(self, request) -> bool:
        return False  # people connect their own, in My account

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # revoked, so that the person is told why

    @admin.display(description="State")
    def state(self, credential: PersonalCredential) -> str:
        if credential.revoked_at:
            return f"revoked by {credential.revoked_by}"
        return "expired: to connect again" if credential.refresh_failed_at else "active"

    @admin.action(description="Revoke selected connections", permissions=["change"])
    def revoke(self, request, queryset):
        for credential in queryset.select_related("upstream"):
            personal_revoke(credential, actor=request.user.get_username())
        self.message_user(request, f"{queryset.count()} connection(s) revoked.")


@admin.register(LocalPrefix)
class LocalPrefixAdmin(TeamScopedMixin, admin.ModelAdmin):
    """A team's own names for upstreams shared with it (docs/teams.md, "Names across teams"), through the service:
    each change is checked against the names the team sees, and audited."""

    form = LocalPrefixForm
    list_display = ("prefix", "upstream", "team", "updated_at")
    list_filter = ("team",)

    def get_readonly_fields(self, request, obj=None):
        return ("upstream", "team") if obj else ()  # renamed, never moved to another upstream or team

    def save_model(self, request, obj, form, change) -> None:
        local_prefix_set(upstream=obj.upstream, team=obj.team, prefix=obj.prefix, actor=request.user.get_username())

    def delete_model(self, request, obj) -> None:
        local_prefix_set(upstream=obj.upstream, team=obj.team, prefix="", actor=request.user.get_username())

    def delete_queryset(self, request, queryset) -> None:
        for row in queryset.select_related("upstream", "team"):
            self.delete_model(request, row)


@admin.register(VirtualServer)
class VirtualServerAdmin(ServerOverridesMixin, TeamScopedMixin, AuditedSaveMixin, admin.ModelAdmin):
    """Curated endpoints at /mcp/s/<name> (docs/curation.md): the tools each offers its team, by exposed name or
    pattern, and its own overrides of them; everything else about a call (rules, limits, sign-off, audit) is /mcp's."""

    list_display = ("name", "team", "title", "enabled", "endpoint")
    list_filter = ("enabled", "team")
    search_fields = ("name", "title")

    @admin.display(description="Endpoint")
    def endpoint(self, server: VirtualServer) -> str:
        return f"/mcp/s/{server.name}"
