"""An upstream's own credentials blanked out of what it says when it fails: upstreams echo the key they
were given ("invalid key sk-..."), and neither the model nor the audit may read it. Pattern redaction
(policy/redaction.py) cannot know a bare value; the executor, which opened the credentials, does."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the pool imports this module
    from registry.upstreams.connection import Outcome

CREDENTIAL = "[credential]"


def scrubbed(outcome: "Outcome", secrets: tuple[str, ...]) -> "Outcome":
    """A failure or error result with every credential value of the upstream's blanked out."""
    result = outcome.get("result")
    failed = not outcome["ok"] or (isinstance(result, dict) and result.get("isError"))
    return blanked(outcome, secrets) if secrets and failed else outcome


def blanked(value: Any, secrets: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, CREDENTIAL)
        return value
    if isinstance(value, list):
        return [blanked(item, secrets) for item in value]
    if isinstance(value, dict):
        return {key: blanked(item, secrets) for key, item in value.items()}
    return value
