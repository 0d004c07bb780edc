"""Error redaction: the audit keeps an upstream's error whole; the model gets its message without what
would tell it (or whoever steers it) about the infrastructure or hand it a credential.

Order matters: stack traces and `Caused by:` chains go first (they hold paths and addresses of their own),
then URLs before bare addresses and paths (a URL holds both), then credentials.
"""

import ipaddress
import re
from typing import Any

CAUSED_BY = re.compile(r"\s*\bCaused by:.*", re.DOTALL | re.IGNORECASE)
TRACEBACK = re.compile(r"Traceback \(most recent call last\):.*?(?=^\S|\Z)", re.DOTALL | re.MULTILINE)
STACK_LINE = re.compile(
    r"^[ \t]*(at [^\n]*\(?[^\s()]+:\d+(:\d+)?\)?|File \"[^\"]+\", line \d+[^\n]*)[ \t]*\n?", re.MULTILINE
)
URL = re.compile(r"\b[a-z][a-z0-9+.\-]*://[^\s'\"<>]+", re.IGNORECASE)
BEARER = re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=\-]{8,}", re.IGNORECASE)
ASSIGNED_SECRET = re.compile(
    r"\b([A-Za-z0-9_\-]*(?:api[_-]?key|token|secret|password|passwd|pwd|auth|credential)[A-Za-z0-9_\-]*)"
    r"(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&]+)",
    re.IGNORECASE,
)
KNOWN_KEY = re.compile(
    r"\b(sk-[A-Za-z0-9_\-]{16,}|sb_[A-Za-z0-9]+_[A-Za-z0-9_\-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|"
    r"github_pat_[A-Za-z0-9_]{20,}|xox[abprs]-[A-Za-z0-9\-]{10,}|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_\-]{35}|"
    r"eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]+)"
)
LONG_TOKEN = re.compile(r"\b(?=[A-Za-z0-9+/_\-]*\d)(?=[A-Za-z0-9+/_\-]*[A-Za-z])[A-Za-z0-9+/_\-]{32,}={0,2}")
IPV4 = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?\b")
IPV6_CANDIDATE = re.compile(
    r"\[([0-9a-f:.]+)\](?::\d{1,5})?|(?<![\w:.])([0-9a-f:.]*:[0-9a-f:.]*)(?![\w:])", re.IGNORECASE
)
HOST_PORT = re.compile(r"\b(?:localhost|[a-z0-9\-]+(?:\.[a-z0-9\-]+)+):\d{2,5}\b", re.IGNORECASE)
PATH = re.compile(r"(?<![\w/])(?:~|[A-Za-z]:)?(?:[/\\][\w.\-@+]+){2,}[/\\]?|(?<![\w/])~[/\\][\w.\-/\\]+")


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _ipv6_replaced(match: re.Match[str]) -> str:
    """An IPv6 address becomes a placeholder; a bare one may run into a colon of the sentence ("::1: refused")."""
    if match[1]:
        return "[address]" if _is_ipv6(match[1]) else match[0]
    text = match[2]
    for cut in range(len(text) - len(text.rstrip(":")) + 1):
        if _is_ipv6(text[: len(text) - cut]):
            return "[address]" + text[len(text) - cut :]
    return match[0]


REPLACEMENTS = (
    (TRACEBACK, ""),
    (STACK_LINE, ""),
    (URL, "[url]"),
    (BEARER, r"\1 [redacted]"),
    (ASSIGNED_SECRET, r"\1\2[redacted]"),
    (KNOWN_KEY, "[redacted]"),
    (IPV6_CANDIDATE, _ipv6_replaced),
    (IPV4, "[address]"),
    (HOST_PORT, "[address]"),
    (PATH, "[path]"),
    (LONG_TOKEN, "[redacted]"),
)


def redact(message: str) -> str:
    """The message with infrastructure details and credentials replaced by placeholders."""
    text = CAUSED_BY.sub("", message)
    for pattern, replacement in REPLACEMENTS:
        text = pattern.sub(replacement, text)
    return re.sub(r"[ \t]+\n", "\n", text).strip() or "The service reported an error."


INPUT_VALIDATION = re.compile(r"validation error|invalid (arguments|params|parameters|input)", re.IGNORECASE)


def redact_unless_validation(message: str) -> str:
    """Input-validation messages tell the model how to fix its call: they pass intact."""
    return message if INPUT_VALIDATION.search(message) else redact(message)


def _redact_strings(value: Any) -> Any:
    if isinstance(value, str):
        return redact_unless_validation(value)
    if isinstance(value, dict):
        return {key: _redact_strings(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_redact_strings(item) for item in value]
    return value


def redact_error_result(result: dict) -> dict:
    """A tool's own error result (`isError`): the text of its content, and every string of its structured
    content, redacted for the model."""
    content = [
        item | {"text": redact_unless_validation(item["text"])}
        if item.get("type") == "text" and isinstance(item.get("text"), str)
        else item
        for item in result.get("content") or []
    ]
    redacted = result | {"content": content}
    if "structuredContent" in result:
        redacted["structuredContent"] = _redact_strings(result["structuredContent"])
    return redacted
