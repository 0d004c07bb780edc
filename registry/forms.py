"""The upstream form: `env` and `headers` often hold credentials, so their values never go back to the
browser. Each shows as MASK; a MASK sent back keeps the stored value, anything else replaces it. A form
shown again after an error masks newly typed values too: they have to be typed again."""

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from registry.models import Upstream

MASK = "********"


class SecretMapField(forms.JSONField):
    def prepare_value(self, value: Any) -> str:
        if isinstance(value, dict):
            value = {key: MASK for key in value}
        return super().prepare_value(value)


class UpstreamForm(forms.ModelForm):
    env = SecretMapField(required=False, help_text="Environment of a stdio server. Stored values show as " + MASK)
    headers = SecretMapField(required=False, help_text="HTTP headers sent upstream. Stored values show as " + MASK)

    class Meta:
        model = Upstream
        fields = "__all__"

    def clean_env(self) -> dict[str, str]:
        return self._unmask("env")

    def clean_headers(self) -> dict[str, str]:
        return self._unmask("headers")

    def _unmask(self, name: str) -> dict[str, str]:
        value = self.cleaned_data.get(name) or {}
        if not isinstance(value, dict):
            raise ValidationError("A JSON object of strings.")
        stored = getattr(self.instance, name) if self.instance.pk else {}
        unknown = sorted(key for key, item in value.items() if item == MASK and key not in stored)
        if unknown:
            raise ValidationError(f"Enter a value for {', '.join(unknown)}: nothing is stored for it yet.")
        return {key: stored[key] if item == MASK else item for key, item in value.items()}
