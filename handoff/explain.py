"""Can this caller call this tool, and why: the static decision a call would get now (policy/decisions.py, over a
snapshot compiled from the database as it is), with the rule or stance it rests on. The console, the REST API
and `manage.py policy_explain` all ask here. Admission (limits, breakers, isolation) depends on the moment and
is not part of the answer."""

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from handoff.snapshot import snapshot_compile
from policy.decisions import Who
from policy.models import Agent, Person


class ExplainRefused(Exception):
    """The question names something that does not exist (`not_found`), or names it ambiguously."""

    def __init__(self, message: str, *, not_found: bool = True) -> None:
        super().__init__(message)
        self.not_found = not_found


@dataclass(frozen=True)
class CallExplained:
    agent: str
    tool: str
    person: Person | None
    code: str  # "" when allowed
    message: str
    policy: dict[str, Any] | None  # the rule or the stance, as a denied row's detail.policy; None: decided before

    def shown(self) -> dict[str, Any]:
        """The answer as the REST API and the command give it."""
        person = {"issuer": self.person.issuer, "subject": self.person.subject} if self.person else None
        return {
            "agent": self.agent,
            "person": person,
            "tool": self.tool,
            "allowed": not self.code,
            "code": self.code,
            "message": self.message,
            "policy": self.policy,
        }


def _person(subject: str, issuer: str) -> Person | None:
    if not subject:
        return None
    people = list(Person.objects.filter(subject=subject, **({"issuer": issuer} if issuer else {}))[:2])
    if not people:
        raise ExplainRefused(f"No person has the subject {subject!r}" + (f" at {issuer!r}." if issuer else "."))
    if len(people) > 1:
        raise ExplainRefused(f"Several people have the subject {subject!r}: name the issuer too.", not_found=False)
    return people[0]


def call_explain(
    *,
    agent: str,
    tool: str,
    person: str = "",
    issuer: str = "",
    groups: tuple[str, ...] = (),
    agents: QuerySet[Agent] | None = None,
) -> CallExplained:
    """The answer for `agent` (and the person with subject `person`, counted in the agent groups their IdP
    `groups` map to, as their token would count them) calling the exposed name `tool`; `agents` are those the
    asker may see (every one by default): another is as unknown as a name nobody has."""
    # PostgreSQL text holds no NUL: a name with one names nothing (and would fail the lookup itself).
    agents = Agent.objects.all() if agents is None else agents
    found = agents.filter(name=agent).first() if "\x00" not in agent else None
    if found is None:
        raise ExplainRefused(f"No agent is named {agent!r}.")
    someone = _person(person, issuer)
    snap = snapshot_compile()
    counted = frozenset().union(*(snap.idp_groups.get(name, ()) for name in groups))
    who = Who(found.id, (someone.issuer, someone.subject) if someone else None, counted)
    explained = snap.explain(who, tool)
    denial = explained.denial
    if denial and denial.code == "TOOL_NOT_FOUND":
        raise ExplainRefused(f"No tool is exposed as {tool!r}: name it as tools/list shows it.")
    grounds = explained.grounds.detail() if explained.grounds else None
    return CallExplained(agent, tool, someone, denial.code if denial else "", denial.message if denial else "", grounds)
