"""The upstream form: `env`, `headers` and `query` often hold credentials, so their values never go back to the
browser. Each shows as MASK; a MASK sent back keeps the stored value, anything else replaces it. A form
shown again after an error masks newly typed values too: they have to be typed again."""

import copy
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

from policy.models import Team
from registry.models import LocalPrefix, PersonalCredential, Upstream
from registry.services import local_prefix_check, share_refusal

MASK = "********"


def unmasked(values: dict[str, str], stored: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """`values` with each MASK replaced by the stored value of that name, and the names sent masked that
    have none stored (the caller refuses those)."""
    unknown = sorted(key for key, value in values.items() if value == MASK and key not in stored)
    return {key: stored.get(key, value) if value == MASK else value for key, value in values.items()}, unknown


class SecretMapField(forms.JSONField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(initial=dict, **kwargs)  # a new upstream's field starts as {}, not null

    def prepare_value(self, value: Any) -> str:
        if isinstance(value, dict):
            value = {key: MASK for key in value}
        return super().prepare_value(value)


class UpstreamForm(forms.ModelForm):
    env = SecretMapField(required=False, help_text="Environment of a stdio server. Stored values show as " + MASK)
    headers = SecretMapField(required=False, help_text="HTTP headers sent upstream. Stored values show as " + MASK)
    query = SecretMapField(
        required=False,
        help_text="Query parameters added to the URL (a query typed into the URL moves here). Stored values show "
        "as " + MASK,
    )

    person_client = SecretMapField(
        required=False,
        label="Person client",
        help_text="Per person, OAuth or token exchange: the gateway's client_id and client_secret at the upstream's "
        "authorization server (empty for OAuth: registered dynamically). Stored values show as " + MASK,
    )

    openapi_file = forms.FileField(
        required=False,
        label="OpenAPI file",
        help_text="REST: upload its OpenAPI 3.0/3.1 document (JSON or YAML); it replaces the document below",
    )

    class Meta:
        model = Upstream
        fields = "__all__"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "catalog_credential" in self.fields:  # only a connection to this very upstream can sync it
            own = PersonalCredential.objects.filter(upstream_id=self.instance.pk, revoked_at=None)
            self.fields["catalog_credential"].queryset = own if self.instance.pk else own.none()

    def clean_openapi_document(self) -> str:
        upload = self.files.get(self.add_prefix("openapi_file"))
        if upload is None:
            return self.cleaned_data.get("openapi_document", "")
        limit = settings.GATEWAY_REST_DOCUMENT_MAX_BYTES
        if upload.size > limit:
            raise ValidationError(f"The uploaded document is {upload.size:,} bytes; the limit is {limit:,}.")
        try:
            return upload.read().decode()
        except UnicodeDecodeError as exc:
            raise ValidationError("The uploaded document is not UTF-8 text (JSON or YAML).") from exc

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        owner = cleaned.get("team")
        if owner is not None and owner in (cleaned.get("shared_with") or ()):
            self.add_error("shared_with", f"Team {owner.slug!r} owns this upstream: share it with other teams.")
        elif owner is not None and self.instance.pk and (problem := self._share_refusal(owner, cleaned)):
            self.add_error("shared_with", problem)
        return cleaned

    def _share_refusal(self, owner: Team, cleaned: dict[str, Any]) -> str:
        """A share whose names a borrower already uses is refused (a new upstream has no names yet: its first
        sync refuses those that collide)."""
        upstream = copy.copy(self.instance)
        upstream.team = owner
        for name in ("slug", "prefixed", "handoff_only"):
            setattr(upstream, name, cleaned.get(name, getattr(upstream, name)))
        teams = list(cleaned.get("shared_with") or ())
        return share_refusal(upstream=upstream, teams=teams, shared_with_all=bool(cleaned.get("shared_with_all")))

    def clean_env(self) -> dict[str, str]:
        return self._unmask("env")

    def clean_headers(self) -> dict[str, str]:
        return self._unmask("headers")

    def clean_query(self) -> dict[str, str]:
        return self._unmask("query")

    def clean_person_client(self) -> dict[str, str]:
        return self._unmask("person_client")

    def _unmask(self, name: str) -> dict[str, str]:
        value = self.cleaned_data.get(name) or {}
        if not isinstance(value, dict):
            raise ValidationError("A JSON object of strings.")
        merged, unknown = unmasked(value, getattr(self.instance, name) if self.instance.pk else {})
        if unknown:
            raise ValidationError(f"Enter a value for {', '.join(unknown)}: nothing is stored for it yet.")
        return merged


class LocalPrefixForm(forms.ModelForm):
    class Meta:
        model = LocalPrefix
        fields = ("upstream", "team", "prefix")

    def clean(self) -> dict:
        cleaned = super().clean()
        kept = self.instance.pk is not None  # on change, upstream and team are read-only: the row's own
        upstream = self.instance.upstream if kept else cleaned.get("upstream")
        team = self.instance.team if kept else cleaned.get("team")
        if upstream is not None and team is not None and cleaned.get("prefix"):
            local_prefix_check(upstream=upstream, team=team, prefix=cleaned["prefix"])  # the service's own words
        return cleaned
