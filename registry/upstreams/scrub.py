"""An upstream's own credentials blanked out of everything it says: upstreams echo the key they were given
("invalid key sk-...", "your key is ..."), in errors and in results, resources and prompts alike, and neither the
model nor the audit may read it. Pattern redaction (policy/redaction.py) cannot know a bare value; the executor,
which opened the credentials, does."""

from typing import Any

from registry.upstreams.outcome import Outcome

CREDENTIAL = "[credential]"


def scrubbed(outcome: Outcome, secrets: tuple[str, ...]) -> Outcome:
    """The outcome, successful or not, with every credential value of the upstream's blanked out."""
    return blanked(outcome, secrets) if secrets else outcome


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
