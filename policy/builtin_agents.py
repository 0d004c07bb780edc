"""The agents the gateway itself acts as, each explained where operators meet it (the agent list and page, the
rule and agent-group pickers): an agent an operator did not make should never pass for one they forgot."""

from django.conf import settings

from policy.models import Agent

CONSOLE_AGENT = "console"  # the console's "Test this tool" (handoff/console.py)


def _builtins() -> dict[str, tuple[str, str]]:
    """Name -> (what a picker says, what the agent's page says)."""
    return {
        CONSOLE_AGENT: (
            "the console's Test this tool",
            "Operators' calls from a tool's Test this tool page run as this agent, with the operator as each "
            "row's actor. It holds no key; rules, limits and its switch apply to it as to any agent.",
        ),
        settings.GATEWAY_AUTH_SERVER_AGENT: (
            "people signed in here",
            "People signed in through this gateway's own OAuth server, and their personal API keys.",
        ),
    }


def builtin_description(name: str) -> str:
    """What a built-in agent is for; empty for one of the operators' own."""
    found = _builtins().get(name)
    return f"Built in. {found[1]}" if found else ""


def agent_label(agent: Agent) -> str:
    """An agent as a picker shows it: a built-in one says so."""
    found = _builtins().get(agent.name)
    return f"{agent.name} (built in: {found[0]})" if found else agent.name
