"""The built-in after-execute stage (handoff/stages.py): secrets in a tool's result are blanked before the model
reads it. Patterns: AWS access key ids, private key blocks and bearer tokens, and GATEWAY_RESULT_FILTER_PATTERNS.
Each match becomes `[redacted]`; the completion row says how many of each kind were blanked (never what)."""

import re
from collections import Counter
from functools import cache
from typing import Any

from django.conf import settings

from handoff.stages import StageCall, own_after_execute

BLANK = "[redacted]"
BUILT_IN = {
    "aws_access_key": r"\b(?:AKIA|ASIA|ABIA|ACCA|AIDA|AROA)[0-9A-Z]{16}\b",
    "private_key": r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
    "bearer_token": r"\b[Bb]earer\s+[A-Za-z0-9\-._~+/]{8,}=*",
}


@cache
def patterns() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """The built-in patterns, then the operator's (validated when the settings load)."""
    extra = {f"pattern_{number}": pattern for number, pattern in enumerate(settings.GATEWAY_RESULT_FILTER_PATTERNS, 1)}
    return tuple((name, re.compile(pattern)) for name, pattern in (BUILT_IN | extra).items())


def blanked(value: Any, found: Counter[str]) -> Any:
    """`value` with every match of every pattern in its strings blanked, counted in `found` by pattern. Only the
    lists and dicts that hold a match are copied: a result that holds none (most do not) is `value` itself, which
    the stages' loop checks no further."""
    if isinstance(value, str):
        for name, pattern in patterns():
            if pattern.search(value):  # cheaper than a subn that finds nothing
                value, count = pattern.subn(BLANK, value)
                found[name] += count
        return value
    if isinstance(value, (dict, list)):
        copy: Any = None
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            if (new := blanked(item, found)) is not item:
                if copy is None:
                    copy = value.copy()
                copy[key] = new
        return value if copy is None else copy
    return value


@own_after_execute(name="result_filter")
def result_filter(call: StageCall, result: dict[str, Any]) -> dict[str, Any]:
    if not settings.GATEWAY_RESULT_FILTER:
        return result
    found: Counter[str] = Counter()
    filtered = blanked(result, found)
    if found:
        call.audit["redacted"] = dict(sorted(found.items()))
    return filtered
