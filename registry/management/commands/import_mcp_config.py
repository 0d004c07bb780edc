import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from registry.config_import import mcp_config_import
from registry.models import Upstream
from registry.services import upstream_catalog_sync


class Command(BaseCommand):
    help = "Import upstreams from an mcpServers JSON file (the format of Claude Desktop and other clients)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("file", type=Path)
        parser.add_argument("--no-sync", action="store_true", help="Do not fetch the new upstreams' tools now")
        parser.add_argument(
            "--internal",
            action="store_true",
            help="Mark HTTP upstreams as internal: they may reach private and loopback addresses",
        )

    def handle(self, *args, file: Path, no_sync: bool, internal: bool, **options) -> None:
        try:
            config = json.loads(file.read_text())
            report = mcp_config_import(config=config, actor="manage.py import_mcp_config", internal=internal)
        except (OSError, ValueError) as exc:
            raise CommandError(f"{file}: {exc}") from exc
        specialists = set(Upstream.objects.filter(handoff_only=True).values_list("slug", flat=True))
        for slug in report.created:
            self.stdout.write(f"created  {slug}{' (handoff target)' if slug in specialists else ''}")
        for slug in report.updated:
            self.stdout.write(f"updated  {slug}{' (handoff target)' if slug in specialists else ''}")
        for name, why in report.skipped:
            self.stdout.write(f"skipped  {name}: {why}")
        for name, why in report.rejected:
            self.stdout.write(f"rejected {name}: {why}")
        if not no_sync:
            # Handoff targets are not synced: each handoff lists their tools through its own tunnel.
            imported = Upstream.objects.filter(slug__in=report.created + report.updated, enabled=True)
            for upstream in imported.exclude(handoff_only=True):
                self.stdout.write(upstream_catalog_sync(upstream=upstream).summary())
