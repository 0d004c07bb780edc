"""What the model reads of an outcome: results as the upstream sent them, errors redacted (the audit has them
whole)."""

from typing import Any

from policy.redaction import redact, redact_error_result
from registry.upstreams.outcome import Outcome


def for_model(name: str, outcome: Outcome) -> dict[str, Any]:
    if outcome["ok"]:
        result = outcome["result"]
        return redact_error_result(result) if result.get("isError") else result
    message = outcome["message"] if outcome.get("validation") else redact(outcome["message"])
    return error_result(f"{name}: {message}")


def error_result(text: str) -> dict[str, Any]:
    """A tool's error result the model reads."""
    return {"content": [{"type": "text", "text": text}], "isError": True}


def error_text(result: dict[str, Any]) -> str:
    return "\n".join(item.get("text", "") for item in result.get("content") or [] if item.get("type") == "text")
