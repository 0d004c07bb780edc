import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from handoff.config_apply import servers_import
from handoff.config_import import EntryOutcome, config_parse, mcp_config_import
from registry.models import Upstream
from registry.services import upstream_catalog_sync

# Exit statuses (README): every entry imported, synced, skipped or up to date; some entry rejected or failed to
# sync (the others are imported); the file itself unusable (unreadable, not JSON, no mcpServers object).
EXIT_ENTRIES_FAILED = 1
EXIT_FILE_UNUSABLE = 2


class Command(BaseCommand):
    help = (
        "Import upstreams from an mcpServers JSON file (the format of Claude Desktop and other clients), and the "
        "virtual servers beside them (virtualServers). "
        "Exits 0 when every entry is imported or skipped, 1 when some entry is rejected or fails to sync, "
        "2 when the file cannot be used."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("file", type=Path)
        parser.add_argument("--no-sync", action="store_true", help="Do not fetch the new upstreams' tools now")
        parser.add_argument(
            "--internal",
            action="store_true",
            help="Mark HTTP upstreams as internal: they may reach private and loopback addresses",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Check every entry and say what would change; write nothing"
        )

    def handle(self, *args, file: Path, no_sync: bool, internal: bool, dry_run: bool, **options) -> None:
        try:
            config = config_parse(text=file.read_text())
            report = mcp_config_import(
                config=config, actor="manage.py import_mcp_config", internal=internal, dry_run=dry_run
            )
        except (OSError, ValueError) as exc:
            raise CommandError(f"{file}: {exc}", returncode=EXIT_FILE_UNUSABLE) from exc
        for entry in report.entries:
            self.stdout.write(entry.line())
        failed = len(report.rejected)
        if not dry_run and not no_sync:
            failed += self._sync(report.imported)
        # After the sync: a virtual server's overrides name tools of the catalogs.
        servers = servers_import(config=config, actor="manage.py import_mcp_config", dry_run=dry_run)
        for server in servers:
            self.stdout.write(server.line())
        failed += sum(server.action == "rejected" for server in servers)
        if dry_run:
            self.stdout.write("dry run: nothing was written")
        if failed:
            message = f"{failed} of {len(report.entries) + len(servers)} entries were rejected or failed to sync"
            raise CommandError(message, returncode=EXIT_ENTRIES_FAILED)

    def _sync(self, imported: list[EntryOutcome]) -> int:
        """Fetch the imported upstreams' tools in the file's order, saying which before each; the failures."""
        # Handoff targets are not synced: each handoff lists their tools through its own tunnel.
        upstreams = Upstream.objects.filter(slug__in=[e.slug for e in imported], enabled=True, handoff_only=False)
        by_slug = {upstream.slug: upstream for upstream in upstreams}
        failed = 0
        for upstream in (by_slug[e.slug] for e in imported if e.slug in by_slug):
            self.stdout.write(f"syncing {upstream.slug}…")
            self.stdout.flush()  # the line is there while the sync waits, piped or not
            started = time.monotonic()
            report = upstream_catalog_sync(upstream=upstream)
            self.stdout.write(f"{report.summary()} ({time.monotonic() - started:.1f} s)")
            failed += not report.ok
        return failed
