from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from handoff.config_document import SECRETS_NOTE, config_export
from handoff.management.json_output import json_write


class Command(BaseCommand):
    help = (
        "Write the gateway's whole configuration (teams, server groups, upstreams, agents, agent groups, handoff "
        "routes, virtual servers, rules) as one JSON document that import_config applies. " + SECRETS_NOTE
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--output", "-o", type=Path, help="Write to this file instead of standard output")

    def handle(self, *args, output: Path | None, **options) -> None:
        try:
            document, variables = config_export()
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        json_write(self, document, output)
        self.stderr.write(SECRETS_NOTE)
        if variables:
            self.stderr.write(f"The import reads these variables from its environment: {', '.join(variables)}")
