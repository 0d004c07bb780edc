from django.core.management.base import BaseCommand, CommandError

from registry.credentials import CredentialError
from registry.personal import personal_credentials_move
from registry.secret_store import SecretStoreUnavailable


class Command(BaseCommand):
    help = (
        "Move every person's credential to its upstream's team's path in the secret store "
        "(tenants/{tenant}/teams/{team}/users/{person}/{upstream}): those stored before teams, and those whose "
        "upstream changed teams since. Run where the private keys are; running it again moves only what is left."
    )

    def handle(self, *args, **options) -> None:
        try:
            moved = personal_credentials_move(actor="manage.py move_credentials")
        except (CredentialError, SecretStoreUnavailable) as exc:
            raise CommandError(f"stopped: {exc}; what was moved is in place, run it again to move the rest") from exc
        self.stdout.write(f"moved {moved} credential(s) to their upstream's team's path")
