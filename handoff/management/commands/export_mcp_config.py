from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from handoff.config_document import servers_export
from handoff.config_import import mcp_config_export
from handoff.management.json_output import json_write


class Command(BaseCommand):
    help = (
        "Write the upstreams as mcpServers JSON that import_mcp_config reads back, and the virtual servers beside "
        "them (virtualServers). Env, header and query values are written as ${VAR} placeholders (never the values), "
        "which the import reads from its environment."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--output", "-o", type=Path, help="Write to this file instead of standard output")

    def handle(self, *args, output: Path | None, **options) -> None:
        try:
            exported = mcp_config_export()
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        servers = servers_export()  # beside mcpServers, where other clients ignore them
        json_write(self, exported.config | ({"virtualServers": servers} if servers else {}), output)
        if exported.variables:
            self.stderr.write(f"The import reads these variables from its environment: {', '.join(exported.variables)}")
