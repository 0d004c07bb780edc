from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from handoff.config_apply import ConfigRefused, config_apply
from handoff.config_import import config_parse


class Command(BaseCommand):
    help = (
        "Make the gateway's configuration what a document of export_config says: creates, changes and removes "
        "objects (teams are never removed) in one transaction, each change audited; refused whole, naming the "
        "object, when anything in it is wrong. A second import of the same document changes nothing."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("file", type=Path)
        parser.add_argument("--dry-run", action="store_true", help="Print what would change; write nothing")

    def handle(self, *args, file: Path, dry_run: bool, **options) -> None:
        try:
            document = config_parse(text=file.read_text())
            changes = config_apply(document=document, actor="manage.py import_config", dry_run=dry_run)
        except ConfigRefused as exc:
            raise CommandError(f"{file}: refused, nothing was applied: {exc}") from exc
        except (OSError, ValueError) as exc:
            raise CommandError(f"{file}: {exc}") from exc
        for change in changes:
            self.stdout.write(change.line())
        if not changes:
            self.stdout.write("nothing to change: the gateway's configuration is the document's")
        elif dry_run:
            self.stdout.write(f"dry run: {len(changes)} changes, nothing was written")
        else:
            self.stdout.write(f"{len(changes)} changes applied")
