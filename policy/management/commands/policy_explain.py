import json

from django.core.management.base import BaseCommand, CommandError

from handoff.explain import ExplainRefused, call_explain


class Command(BaseCommand):
    help = (
        "Whether an agent (and a person acting through it) may call a tool now, and the rule or the stance "
        "that decides it, as JSON (the REST API's /agents/<name>/explain answers the same)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--agent", required=True, help="The agent's name")
        parser.add_argument("--tool", required=True, help="The tool as tools/list names it, e.g. demo__add")
        parser.add_argument("--person", default="", help="A person's subject (as their token names them)")
        parser.add_argument("--issuer", default="", help="The person's issuer, when several share the subject")
        parser.add_argument(
            "--group", action="append", default=[], dest="groups", help="One of the person's IdP groups (repeat)"
        )

    def handle(self, *args, agent: str, tool: str, person: str, issuer: str, groups: list[str], **options) -> None:
        try:
            explained = call_explain(agent=agent, tool=tool, person=person, issuer=issuer, groups=tuple(groups))
        except ExplainRefused as refused:
            raise CommandError(str(refused)) from None
        self.stdout.write(json.dumps(explained.shown(), indent=2))
