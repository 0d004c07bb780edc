"""`manage.py schema_ready`: the database at the current migrations, without replaying them where it can.

Migrating a new SQLite file replays the state of every migration (seconds, nearly all of it Django rebuilding
model classes), though the result is the same file each time. So the first new file of a migration set is kept,
schema only, as a template in the virtualenv ("after the first install"), and the next new file of that set is
a copy of it. The template is named by a hash of the migration files and models of the installed apps: a
changed, added or removed migration names another template, and that file is migrated again. It holds what
migrate writes (the tables, `django_migrations`, content types, permissions, the Auditor group) and never a
key, an agent or a user: those are made per var dir, after the copy.
"""

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from django.apps import apps
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader

TEMPLATE_DIR = Path(sys.prefix) / "share" / "switchboard"


def schema_digest(loader: MigrationLoader) -> str:
    """What a migrated file depends on: every migration's bytes, and the models post_migrate makes rows for."""
    digest = hashlib.sha256()
    for (label, name), migration in sorted(loader.disk_migrations.items()):
        digest.update(f"{label}.{name}\0".encode())
        digest.update(Path(sys.modules[type(migration).__module__].__file__).read_bytes())
    digest.update(" ".join(sorted(model._meta.label for model in apps.get_models())).encode())
    return digest.hexdigest()[:32]


def _template_save(template: Path) -> None:
    """The just-migrated database, schema only, as the template (renamed into place: a reader never sees half)."""
    template.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=template.parent, prefix=".schema-", suffix=".sqlite3")
    os.close(handle)
    os.unlink(partial)  # VACUUM INTO wants a path that does not exist
    with connection.cursor() as cursor:
        cursor.execute("VACUUM INTO %s", [partial])  # one file, whatever the WAL still held
    os.replace(partial, template)


def _template_copy(template: Path, database: Path) -> None:
    database.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=database.parent, prefix=".schema-", suffix=".sqlite3")
    os.close(handle)
    shutil.copyfile(template, partial)
    os.replace(partial, database)


class Command(BaseCommand):
    help = (
        "Bring the database to the current migrations. A new SQLite file is copied from a template of this "
        "migration set when there is one, else migrated (and kept as the template); any other database migrates."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--template-dir", type=Path, default=TEMPLATE_DIR, help="where templates are kept")

    def handle(self, *args, template_dir: Path, verbosity: int, **options) -> None:
        database = Path(connection.settings_dict["NAME"])
        if connection.vendor == "sqlite" and not connection.is_in_memory_db() and not database.exists():
            # Decided before anything opens the file: a copy must not land under an open connection's WAL.
            digest = schema_digest(MigrationLoader(None, ignore_no_migrations=True))
            template = template_dir / f"schema-{digest}.sqlite3"
            if template.exists():
                _template_copy(template, database)
                if verbosity:
                    self.stdout.write(f"{database}: copied from {template}")
                return
            call_command("migrate", verbosity=verbosity)
            _template_save(template)
            return
        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            call_command("migrate", verbosity=verbosity)
