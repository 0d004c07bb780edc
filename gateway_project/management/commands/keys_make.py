"""`manage.py keys_make DIR`: a complete set of new keys, one file each (readable by this user only), for an
operator to store and give every process: as NAME_FILE variables, compose secrets or a Kubernetes Secret
(docs/deploy.md). It writes nothing where any of its files already exists: a key is made once, never remade over
one in use. It prints the files' names, never a key."""

import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from gateway_project.lib.keys import KEY_FILES, key_set_generate
from registry.credentials import public_key_of

# Not a secret: a web process in Celery mode seals credentials with it and holds no private key.
PUBLIC_KEY_FILE = "credential_public_key"


class Command(BaseCommand):
    help = "Make a complete set of new keys, one file each, in a directory (refused if any file exists)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("directory", type=Path)

    def handle(self, *args: object, directory: Path, **options: object) -> None:
        names = [*KEY_FILES.values(), PUBLIC_KEY_FILE]
        present = sorted(name for name in names if (directory / name).exists())
        if present:
            raise CommandError(f"{directory} already holds {', '.join(present)}: no key was made")
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        keys = key_set_generate()
        files = {KEY_FILES[name]: value for name, value in keys.items()}
        files[PUBLIC_KEY_FILE] = public_key_of(keys["GATEWAY_CREDENTIAL_KEYS"])
        for name, value in files.items():
            descriptor = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as file:
                file.write(value)
        for variable, name in KEY_FILES.items():
            self.stdout.write(f"{variable}_FILE={directory.resolve() / name}")
        self.stdout.write(f"GATEWAY_CREDENTIAL_PUBLIC_KEY_FILE={directory.resolve() / PUBLIC_KEY_FILE}")
