import secrets
import sys
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from handoff.config_import import mcp_config_import
from policy.models import Agent
from policy.services import agent_create, agent_key_issue
from registry.models import Upstream
from registry.services import upstream_catalog_sync

DEMO_AGENT = "demo"
SPECIALIST_DESCRIPTION = "Budgets, invoices and payments: hand questions about money to the finance specialist."


class Command(BaseCommand):
    help = (
        "Register the demo upstreams (mcp-server-time and the bundled demo server), optionally the example "
        "finance specialist as a handoff target, and a demo agent."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--specialist-url", default="", help="URL of examples/specialist_server.py finance")

    def handle(self, *args, specialist_url: str, **options) -> None:
        bin_dir = Path(sys.executable).parent
        config = {
            "mcpServers": {
                "time": {"command": str(bin_dir / "mcp-server-time"), "args": ["--local-timezone", "UTC"]},
                "demo": {"command": sys.executable, "args": [str(settings.BASE_DIR / "examples/demo_upstream.py")]},
            }
        }
        mcp_config_import(config=config, actor="setup_demo")
        if specialist_url:  # on this machine's loopback, hence internal
            finance = {"url": specialist_url, "handoff": {"description": SPECIALIST_DESCRIPTION}}
            mcp_config_import(config={"mcpServers": {"finance": finance}}, actor="setup_demo", internal=True)
        for upstream in Upstream.objects.filter(slug__in=["time", "demo"], enabled=True):
            self.stdout.write(upstream_catalog_sync(upstream=upstream).summary())
        agent = Agent.objects.filter(name=DEMO_AGENT).first()
        issued = (
            agent_key_issue(agent=agent, actor="setup_demo")
            if agent
            else agent_create(name=DEMO_AGENT, actor="setup_demo")
        )
        self.stdout.write(f"\nAgent '{DEMO_AGENT}' API key (shown once; keys are stored hashed):\n  {issued.key}\n")
        people = settings.GATEWAY_AUTH_SERVER_AGENT
        if settings.GATEWAY_AUTH_SERVER and not Agent.objects.filter(name=people).exists():
            agent_create(name=people, actor="setup_demo")  # OAuth sign-ins act as it; its key goes unused
        self._admin_user()

    def _admin_user(self) -> None:
        users = get_user_model().objects
        if users.filter(is_superuser=True).exists():
            return
        password = secrets.token_urlsafe(12)
        users.create_superuser("admin", password=password)
        self.stdout.write(f"Admin console login (shown once): admin / {password}\n")
