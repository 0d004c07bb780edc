"""`manage.py audit_checkpoint`: seal what the audit trail holds now (beat does this every minute)."""

from django.core.management.base import BaseCommand

from audit.tasks import audit_checkpoint


class Command(BaseCommand):
    help = "Sign checkpoints over the audit rows written since the last one (and settled)."

    def handle(self, *args, **options) -> None:
        self.stdout.write(f"{audit_checkpoint()} checkpoint(s) made.")
