from django.core.management.base import BaseCommand, CommandError

from gateway_project.lib.keys import key_generate
from registry.credentials import CredentialError, public_key_of
from registry.services import upstream_credentials_reseal


class Command(BaseCommand):
    help = (
        "Key rotation for upstream credentials. --new-key prints a key pair to put first in "
        "GATEWAY_CREDENTIAL_KEYS (and its public half in GATEWAY_CREDENTIAL_PUBLIC_KEY); run without it, where "
        "the private keys are, to seal every stored credential again with the newest key."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--new-key", action="store_true", help="Print a new key pair and change nothing")

    def handle(self, *args, new_key: bool, **options) -> None:
        if new_key:
            private = key_generate()
            self.stdout.write(f"GATEWAY_CREDENTIAL_KEYS={private},<the keys in use now>")
            self.stdout.write(f"GATEWAY_CREDENTIAL_PUBLIC_KEY={public_key_of(private)}")
            return
        try:
            count = upstream_credentials_reseal(actor="manage.py rotate_credentials")
        except CredentialError as exc:
            raise CommandError(f"nothing was changed: {exc}") from exc
        self.stdout.write(f"resealed the credentials of {count} upstream(s) with the newest key")
