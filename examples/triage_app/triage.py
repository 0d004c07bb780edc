"""An example Python triage tool: route a request by topic. Enable with GATEWAY_EXTRA_APPS=examples.triage_app;
TRIAGE_TOPICS (JSON) maps topics to handoff targets, registry keys or mcp:// URIs."""

import json
import os

from handoff.triage import Handoff, triage_tool

DEFAULT_TOPICS = {"money": "mcp://finance", "infrastructure": "devops"}


@triage_tool(
    name="route_by_topic",
    description="Hand the conversation to the specialist for a topic ("
    + ", ".join(sorted(json.loads(os.environ.get("TRIAGE_TOPICS", "null")) or DEFAULT_TOPICS))
    + "). Pass what the specialist needs to know in `details`.",
    input_schema={
        "type": "object",
        "properties": {"topic": {"type": "string"}, "details": {"type": "string"}},
        "required": ["topic"],
    },
)
def route_by_topic(arguments: dict, agent_name: str) -> Handoff | str:
    topics = json.loads(os.environ.get("TRIAGE_TOPICS", "null")) or DEFAULT_TOPICS
    topic = str(arguments.get("topic", ""))
    if topic not in topics:
        return f"No specialist handles {topic!r}; known topics: {', '.join(sorted(topics))}."
    return Handoff(
        target=topics[topic],
        reason=f"{agent_name} asked about {topic}",
        carry_over_state={"topic": topic, "details": arguments.get("details", "")},
    )
