"""`manage.py serve_demo`: what scripts/demo runs, in one process, so that Python and Django start once.

The database is made current (handoff/management/commands/schema_ready.py), the static files collected
(audit/management/commands/static_ready.py), the demo set up
(setup_demo.py, its two teams in handoff/management/demo_teams.py: a restart changes nothing and prints the same
keys), the example finance specialist started
beside it, and Daphne serves the gateway from this very process. The upstream pool is a thread of this process
that outlives the setup: the stdio servers the catalog syncs started are the ones the first calls use. Those servers
start before Django and the SDK are imported (manage.py starts them, handoff/management/demo_servers.py), and the
pool adopts them (registry/upstreams/prestart.py).
"""

import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from handoff.management.commands.setup_demo import DEMO_UPSTREAMS, demo_never_synced, sync_in_thread
from registry.models import Upstream

HOST = "127.0.0.1"
SPECIALIST_NICE = 10
SERVING = """Serving {url}/mcp  (admin: {url}/admin/)
OAuth clients (Claude, Cursor, the MCP Inspector): add {url}/mcp with no key; the client
registers itself, you sign in with a console account (admin above) and allow it; it acts as agent 'people'."""


class Command(BaseCommand):
    help = "Set up the demo (database, upstreams, agent) and serve it with Daphne, with the finance specialist."
    # A server, as Daphne and uvicorn are: the gateway's own checks are logged when the ASGI app loads
    # (gateway_project/checks.py start_warnings_log); Django's (the URLconf, the console's pages, the models) are
    # `manage.py check`'s and CI's, and cost a start 0.2 s that no call needs.
    requires_system_checks = []

    def add_arguments(self, parser) -> None:
        parser.add_argument("--port", type=int, default=8000, help="the gateway's; the specialist takes the next")

    def handle(self, *args, port: int, **options) -> None:
        call_command("schema_ready", verbosity=0)
        call_command("static_ready", later=True, verbosity=0)
        # A restart syncs no catalog before serving (setup_demo syncs those never synced). Syncing them meanwhile
        # starts the pool's sessions before the first call needs them, and picks up a tool changed while the
        # gateway was down.
        for upstream in Upstream.objects.filter(slug__in=DEMO_UPSTREAMS, enabled=True).exclude(last_synced_at=None):
            threading.Thread(target=sync_in_thread, args=(upstream,), name=f"sync-{upstream.slug}", daemon=True).start()
        call_command("setup_demo", specialist_url=f"http://{HOST}:{port + 1}/mcp", no_sync=True)
        self.stdout.flush()  # to a pipe (which buffers) as soon as the key is known
        # A first install's catalogs sync meanwhile, while the specialist starts and Daphne is imported; the port
        # opens once they are in, so that no first call finds its tool unknown.
        fresh = ThreadPoolExecutor(max_workers=len(DEMO_UPSTREAMS), thread_name_prefix="sync")
        syncs = [fresh.submit(sync_in_thread, upstream) for upstream in demo_never_synced()]
        specialist = self._specialist(port)
        # Imported only now, once the upstreams are starting: Daphne and Twisted take 0.16 s that a first call
        # need not wait for, and every other process of the gateway (workers, uvicorn, commands) never loads.
        from daphne.cli import CommandLineInterface

        for sync in syncs:
            self.stdout.write(sync.result().summary())
        fresh.shutdown()
        self.stdout.write(SERVING.format(url=f"http://{HOST}:{port}"))
        self.stdout.flush()  # before Daphne's lines
        try:
            CommandLineInterface().run(["-b", HOST, "-p", str(port), "gateway_project.asgi:application"])
        finally:
            specialist.terminate()
            specialist.wait(timeout=10)

    def _specialist(self, port: int) -> subprocess.Popen:
        """examples/specialist_server.py, which verifies the delegation tokens this gateway signs."""
        env = os.environ | {
            "SWITCHBOARD_DELEGATION_KEYS": settings.GATEWAY_DELEGATION_KEYS,
            "SWITCHBOARD_URL": f"http://{HOST}:{port}",
        }
        script = settings.BASE_DIR / "examples/specialist_server.py"
        process = subprocess.Popen(
            [sys.executable, str(script), "finance", str(port + 1)], env=env, cwd=settings.BASE_DIR
        )
        # Its start (0.8 s of CPU) yields to this process's while both start: no first call needs the specialist.
        os.setpriority(os.PRIO_PROCESS, process.pid, SPECIALIST_NICE)
        return process
