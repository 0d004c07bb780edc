"""A virtual server's own tool overrides in the console: inline on the server's page, checked and saved through
registry/server_overrides.py (so each change is an audit row), never by the formset itself."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest

from registry.models import ServerToolOverride, VirtualServer
from registry.overrides import OVERRIDE_FIELDS
from registry.server_overrides import server_override_check, server_override_clear, server_override_set


def _data(cleaned: dict[str, Any]) -> dict[str, Any]:
    """The override as the service takes it (registry/overrides.py), from the form's fields."""
    return {key: cleaned[key] for key in OVERRIDE_FIELDS if cleaned.get(key) not in (None, "", [], {})}


class ServerOverrideForm(forms.ModelForm):
    class Meta:
        model = ServerToolOverride
        fields = ("tool", *OVERRIDE_FIELDS)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        server, tool = getattr(self.instance, "server", None), cleaned.get("tool")
        if server is not None and server.pk and tool is not None and not self.cleaned_data.get("DELETE"):
            try:
                server_override_check(server=server, tool=tool, data=_data(cleaned))
            except ValidationError as refused:
                raise ValidationError(" ".join(refused.messages)) from None
        return cleaned


class ServerOverrideInline(admin.StackedInline):
    """How the server presents a tool it offers, on top of the upstream's override (docs/curation.md). Parameters
    are named as /mcp shows the tool."""

    model = ServerToolOverride
    form = ServerOverrideForm
    extra = 0
    raw_id_fields = ("tool",)
    verbose_name = "tool override"


class ServerOverridesMixin:
    """For VirtualServerAdmin: the inline, whose rows the services save."""

    inlines = [ServerOverrideInline]

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        if formset.model is not ServerToolOverride:
            super().save_formset(request, form, formset, change)  # type: ignore[misc]
            return
        server: VirtualServer = form.instance
        actor = request.user.get_username()
        # What formset.save() would have listed, for the change message the admin writes after (the audit rows are
        # the services').
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
        try:
            for row in formset.forms:
                _row_save(server, row, row in formset.deleted_forms, actor)
        except ValidationError as refused:
            messages.error(request, f"Tool override not saved: {' '.join(refused.messages)}")


def _row_save(server: VirtualServer, row: forms.ModelForm, deleted: bool, actor: str) -> None:
    before = row.instance.tool if row.instance.pk else None
    tool = row.cleaned_data.get("tool")
    if before is not None and (deleted or before != tool):
        server_override_clear(server=server, tool=before, actor=actor)
    if tool is not None and not deleted and row.has_changed():
        server_override_set(server=server, tool=tool, data=_data(row.cleaned_data), actor=actor)
