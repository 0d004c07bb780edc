"""`manage.py static_ready`: the console's static files collected (hashed, gzip and Brotli copies made for
WhiteNoise), without collecting again what is current.

collectstatic hashes and compresses every file each time it runs, seconds even when nothing changed, and the
manifest it writes is what `{% static %}` reads: so scripts/demo and the tests run this instead, which collects
only when the manifest is missing or older than a file the finders find. A file removed from the sources is not
noticed: run collectstatic itself then (a deployment always does)."""

from pathlib import Path

from django.apps import apps
from django.contrib.staticfiles import finders
from django.contrib.staticfiles.storage import staticfiles_storage
from django.core.management import call_command
from django.core.management.base import BaseCommand


def static_current() -> bool:
    """Whether the manifest is newer than every file collectstatic would gather."""
    manifest = Path(staticfiles_storage.path(staticfiles_storage.manifest_name))
    if not manifest.exists():
        return False
    collected_at = manifest.stat().st_mtime
    ignored = apps.get_app_config("staticfiles").ignore_patterns
    for finder in finders.get_finders():
        for path, storage in finder.list(ignored):
            if storage.get_modified_time(path).timestamp() > collected_at:
                return False
    return True


class Command(BaseCommand):
    help = "Run collectstatic unless what it collected is newer than every static file it would gather."

    def handle(self, *args, verbosity: int, **options) -> None:
        if static_current():
            return
        call_command("collectstatic", interactive=False, verbosity=verbosity)
