"""Manifest sanitising: what an upstream says about its tools is untrusted input that a model will read.

Names must be plain tool names, or the tool is refused at catalog sync; titles and descriptions are
normalised and stripped of what can hide or disguise text from a human reviewer (control, ANSI, zero-width
and bidi characters) and capped; schemas past a size are refused.
"""

import json
import re
import unicodedata
from typing import Any

from django.conf import settings

# The spec's tool-name alphabet, matched in full and in ASCII only.
TOOL_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}", re.ASCII)
# Names that turn into prototype pollution when a client keys a JavaScript object by tool name.
RESERVED_NAMES = frozenset(
    "__proto__ constructor prototype __defineGetter__ __defineSetter__ __lookupGetter__ __lookupSetter__ "
    "hasOwnProperty isPrototypeOf propertyIsEnumerable toString toLocaleString valueOf".split()
)
ANSI_ESCAPE = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")
KEPT_CONTROLS = frozenset("\n\t")


def tool_name_problem(name: Any) -> str | None:
    """Why a tool name is refused, or None."""
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        return "not 1-128 characters of A-Z a-z 0-9 _ - ."
    if name in RESERVED_NAMES:
        return "a reserved name"
    return None


def schema_problem(definition: dict[str, Any]) -> str | None:
    """Why a tool's schemas are refused, or None."""
    for key in ("inputSchema", "outputSchema"):
        schema = definition.get(key)
        if schema is not None and len(json.dumps(schema)) > settings.GATEWAY_MAX_SCHEMA_BYTES:
            return f"{key} larger than {settings.GATEWAY_MAX_SCHEMA_BYTES} bytes"
    return None


def clean_text(text: str, limit: int) -> str:
    """NFKC, without ANSI sequences, control characters (but newline and tab) or format characters
    (Unicode category Cf: zero-width and bidi controls among them), cut to `limit` characters."""
    text = ANSI_ESCAPE.sub("", unicodedata.normalize("NFKC", text))
    kept = (c for c in text if c in KEPT_CONTROLS or unicodedata.category(c) not in ("Cc", "Cf", "Cs", "Co"))
    cleaned = "".join(kept).strip()
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


def manifest_sanitize(definition: dict[str, Any]) -> dict[str, Any]:
    """The definition as agents see it: texts cleaned wherever a client shows them."""
    clean = dict(definition)
    if isinstance(clean.get("description"), str):
        clean["description"] = clean_text(clean["description"], settings.GATEWAY_MAX_DESCRIPTION_CHARS)
    if isinstance(clean.get("title"), str):
        clean["title"] = clean_text(clean["title"], settings.GATEWAY_MAX_TITLE_CHARS)
    annotations = clean.get("annotations")
    if isinstance(annotations, dict) and isinstance(annotations.get("title"), str):
        clean["annotations"] = annotations | {
            "title": clean_text(annotations["title"], settings.GATEWAY_MAX_TITLE_CHARS)
        }
    return clean
