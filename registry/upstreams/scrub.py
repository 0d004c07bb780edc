"""An upstream's own credentials blanked out of everything it says: upstreams echo the key they were given
("invalid key sk-...", "your key is ..."), in errors and in results, resources and prompts alike, and in what they
send while they work (progress, log messages, requests to the client), and neither the model nor the audit may
read it. Pattern redaction (policy/redaction.py) cannot know a bare value; the executor,
which opened the credentials, does."""

from typing import Any

from registry.upstreams.outcome import Outcome
from registry.upstreams.relay import Relay

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


class ScrubbedRelay:
    """A call's relay that blanks the upstream's credentials out of what it carries to the agent. The agent's
    answers travel the other way untouched: they are the agent's, not the upstream's."""

    def __init__(self, relay: Relay, secrets: tuple[str, ...]) -> None:
        self._relay, self._secrets = relay, secrets
        self.capabilities, self.wanted = relay.capabilities, relay.wanted

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        await self._relay.progress(progress, total, blanked(message, self._secrets))

    async def log(self, level: str, data: Any, logger: str | None) -> None:
        await self._relay.log(level, blanked(data, self._secrets), logger)

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return await self._relay.ask(method, blanked(params, self._secrets))
