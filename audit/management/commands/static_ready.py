"""`manage.py static_ready`: the console's static files collected (hashed, gzip and Brotli copies made for
WhiteNoise), without collecting again what is current. `--later` (scripts/demo's first start) collects them hashed
and leaves their compression to a process of its own (audit/static_compression.py): Brotli's best level takes two
seconds of the embedded default's start, and the pages need only the manifest; a process serving meanwhile sends
them uncompressed until it restarts (WhiteNoise looks for the copies as it starts).

collectstatic hashes and compresses every file each time it runs, seconds even when nothing changed, and the
manifest it writes is what `{% static %}` reads: so scripts/demo and the tests run this instead, which collects
only when the manifest is missing or older than a file the finders find. A file removed from the sources is not
noticed: run collectstatic itself then (a deployment always does)."""

import subprocess
import sys
import threading
from pathlib import Path

from django.apps import apps
from django.conf import settings
from django.contrib.staticfiles import finders
from django.contrib.staticfiles.management.commands.collectstatic import Command as Collect
from django.contrib.staticfiles.storage import ManifestStaticFilesStorage, staticfiles_storage
from django.core.management import call_command
from django.core.management.base import BaseCommand

from audit.static_compression import compressed_mark


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

    def add_arguments(self, parser) -> None:
        parser.add_argument("--later", action="store_true", help="compress in a process of its own, not waited for")

    def handle(self, *args, verbosity: int, later: bool, **options) -> None:
        current = static_current()
        if not later:
            if not current:
                call_command("collectstatic", interactive=False, verbosity=verbosity)
            return
        mark = compressed_mark(Path(settings.STATIC_ROOT))
        if current and mark.exists():
            return
        if not current:
            mark.unlink(missing_ok=True)
            collect = Collect()
            collect.storage = ManifestStaticFilesStorage()  # hashed names and the manifest, nothing compressed
            call_command(collect, interactive=False, verbosity=verbosity)
            # This process's storage read the manifest before there was one: the pages name files by it.
            staticfiles_storage.hashed_files, staticfiles_storage.manifest_hash = staticfiles_storage.load_manifest()
        command = [sys.executable, "-m", "audit.static_compression", str(settings.STATIC_ROOT)]
        compressing = subprocess.Popen(command, cwd=settings.BASE_DIR, stdin=subprocess.DEVNULL)
        threading.Thread(target=compressing.wait, name="static-compression", daemon=True).start()  # reaped
