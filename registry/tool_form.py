"""The console's form for trying a tool, made from its input schema. The schema is what an upstream sent, so
it is read as untrusted input: only the top level becomes fields, at most MAX_FIELDS of them, texts are cut
short (and escaped by the template like any value), and whatever a simple field cannot express is typed as
JSON."""

import json
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

from gateway_project.lib.json_depth import nested_deeper_than

MAX_FIELDS = 30
MAX_CHOICES = 50
MAX_TEXT = 300  # a label's or help text's characters
MAX_ARGUMENTS_BYTES = 64 * 1024


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    text = value if isinstance(value, str) else ""
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def _json_value(text: str) -> Any:
    limit = settings.GATEWAY_MAX_JSON_DEPTH  # as for an agent's arguments (and Python's parser recurses)
    if nested_deeper_than(text, limit):
        raise ValidationError(f"The JSON is nested deeper than {limit} levels.")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValidationError(f"Not valid JSON: {exc}") from None


class JsonField(forms.CharField):
    """A value typed as JSON (an object, a list, or anything a simple field cannot hold)."""

    widget = forms.Textarea(attrs={"rows": 4, "cols": 60, "class": "vLargeTextField"})

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=MAX_ARGUMENTS_BYTES, strip=True, **kwargs)

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        return _json_value(text) if text else None


class Tristate(forms.TypedChoiceField):
    """A boolean that may also be left out."""

    def __init__(self, **kwargs: Any) -> None:
        choices = [("", "(not set)"), ("true", "true"), ("false", "false")]
        super().__init__(choices=choices, coerce=lambda v: v == "true", empty_value=None, **kwargs)


def _enum_field(values: list[Any], **common: Any) -> forms.Field:
    choices = [("", "(not set)")] + [(json.dumps(v), _text(json.dumps(v), 80)) for v in values[:MAX_CHOICES]]
    return forms.TypedChoiceField(choices=choices, coerce=json.loads, empty_value=None, **common)


def _field(schema: Any, required: bool, help_text: str) -> forms.Field:
    """One property's field: a simple one when its type says which, JSON otherwise."""
    common = {"required": required, "help_text": help_text}
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(schema, dict) and isinstance(schema.get("enum"), list) and schema["enum"]:
        return _enum_field(schema["enum"], **common)
    match kind:
        case "string":
            return forms.CharField(max_length=MAX_ARGUMENTS_BYTES, strip=False, **common)
        case "integer":
            return forms.IntegerField(**common)
        case "number":
            return forms.FloatField(**common)
        case "boolean":
            return Tristate(**common)
    return JsonField(**common | {"help_text": f"JSON. {help_text}".strip()})


def _properties(schema: Any) -> dict[str, Any] | None:
    """The top-level properties, when a form of fields can hold them; None: one JSON object instead."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties", {}), dict):
        return None
    properties = schema.get("properties", {})
    if len(properties) > MAX_FIELDS or not all(isinstance(name, str) for name in properties):
        return None
    return properties


class ToolArgumentsForm(forms.Form):
    """Fields named `arg<n>` (a property's name is the label, never an HTML name), or one `arguments` JSON
    object when the schema is not a plain object of at most MAX_FIELDS properties."""

    def __init__(self, schema: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.names: dict[str, str] = {}  # field name → property name
        properties = _properties(schema)
        if properties is None:
            self.fields["arguments"] = JsonField(required=False, label="Arguments (a JSON object)")
            return
        required = set(schema.get("required") or []) if isinstance(schema.get("required"), list) else set()
        for index, (name, prop) in enumerate(properties.items()):
            described = prop.get("description") if isinstance(prop, dict) else None
            field = _field(prop, name in required, _text(described))
            field.label = _text(name, 100)
            self.fields[f"arg{index}"] = field
            self.names[f"arg{index}"] = name

    def arguments(self) -> dict[str, Any]:
        """The call's arguments (valid form only); a left-out optional field is left out of them."""
        data = self.cleaned_data
        if not self.names:
            value = data.get("arguments")
            return {} if value is None else value
        return {self.names[f]: v for f, v in data.items() if v not in (None, "")}

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if not self.names and data.get("arguments") is not None and not isinstance(data["arguments"], dict):
            raise ValidationError("The arguments must be a JSON object, such as {}.")
        return data


def arguments_parse(text: str) -> dict[str, Any]:
    """The arguments carried through the confirmation step: a JSON object, bounded."""
    if len(text.encode()) > MAX_ARGUMENTS_BYTES:
        raise ValidationError(f"The arguments are over {MAX_ARGUMENTS_BYTES // 1024} KiB.")
    value = _json_value(text)
    if not isinstance(value, dict):
        raise ValidationError("The arguments must be a JSON object.")
    return value
