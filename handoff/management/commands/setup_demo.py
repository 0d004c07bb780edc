from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import connection
from django.utils import timezone

from handoff.config_import import mcp_config_import
from handoff.management.demo_passwords import Passwords
from handoff.management.demo_servers import demo_servers
from handoff.management.demo_teams import PAYMENTS_AGENT, demo_teams_setup, team_admins_missing
from policy.keys import key_matches, key_split
from policy.models import Agent, Team
from policy.services import agent_create, agent_key_issue, policy_object_save
from registry.models import Upstream, VirtualServer
from registry.services import SyncReport, upstream_catalog_sync

DEMO_AGENT = "demo"
ADMIN = "admin"  # the gateway's admin a first install makes
DEMO_UPSTREAMS = ("time", "demo")
# The demo's virtual server (docs/curation.md): a curated endpoint of a few of the demo's tools.
DESK = {"name": "desk", "title": "Demo desk", "tools": ["demo__echo", "demo__add", "time__get_current_time"]}
SPECIALIST_DESCRIPTION = "Budgets, invoices and payments: hand questions about money to the finance specialist."


class Command(BaseCommand):
    help = (
        "Register the demo upstreams (mcp-server-time and the bundled demo server), optionally the example "
        "finance specialist as a handoff target, and a demo agent."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--specialist-url", default="", help="URL of examples/specialist_server.py finance")
        parser.add_argument(
            "--no-sync", action="store_true", help="leave the catalogs never synced to the caller (serve_demo's)"
        )

    def handle(self, *args, specialist_url: str, no_sync: bool, **options) -> None:
        admin = [] if get_user_model().objects.filter(is_superuser=True).exists() else [ADMIN]
        passwords = Passwords(admin + team_admins_missing())  # hashing while the rest is set up
        mcp_config_import(config={"mcpServers": demo_servers()}, actor="setup_demo")  # skips one as configured
        # On this machine's loopback, hence internal. Imported again only for another URL: an import of a
        # handoff target saves its route even when nothing changed.
        if specialist_url and not Upstream.objects.filter(slug="finance", url=specialist_url).exists():
            finance = {"url": specialist_url, "handoff": {"description": SPECIALIST_DESCRIPTION}}
            mcp_config_import(config={"mcpServers": {"finance": finance}}, actor="setup_demo", internal=True)
        # The catalogs never synced (a restart keeps what it has; the console syncs again on demand), side by side
        # and while this thread makes the agents and the admin: each sync waits on its upstream's start.
        never_synced = [] if no_sync else demo_never_synced()
        with ThreadPoolExecutor(max_workers=len(DEMO_UPSTREAMS)) as threads:
            syncs = [threads.submit(sync_in_thread, upstream) for upstream in never_synced]
            key = _kept_key(DEMO_AGENT, _key_file())
            people = settings.GATEWAY_AUTH_SERVER_AGENT
            if settings.GATEWAY_AUTH_SERVER and not Agent.objects.filter(name=people).exists():
                agent_create(name=people, actor="setup_demo")  # OAuth sign-ins act as it; its key goes unused
            admin_login = _admin_user(passwords)
            teams = demo_teams_setup(passwords)
            payments_key = _kept_key(PAYMENTS_AGENT, settings.VAR_DIR / "payments_key", team=teams.payments)
            if not VirtualServer.objects.filter(name=DESK["name"]).exists():
                policy_object_save(obj=VirtualServer(**DESK), actor="setup_demo", created=True)
        for sync in syncs:
            self.stdout.write(sync.result().summary())
        self.stdout.write(f"\nAgent '{DEMO_AGENT}' API key (kept in {_key_file()}):\n  {key}\n")
        if admin_login:
            self.stdout.write(f"Admin console login (shown once): {admin_login}\n")
        self.stdout.write(teams.about())
        where = settings.VAR_DIR / "payments_key"
        self.stdout.write(f"Agent '{PAYMENTS_AGENT}' API key (team payments, kept in {where}):\n  {payments_key}\n")
        offered = ", ".join(DESK["tools"])
        self.stdout.write(f"Virtual server '{DESK['name']}': /mcp/s/{DESK['name']} offers {offered}\n")


def _admin_user(passwords: Passwords) -> str:
    """The login of the admin made now, or "" if there is one already."""
    if ADMIN not in passwords:
        return ""
    _, password = passwords.user_create(ADMIN, is_staff=True, is_superuser=True)
    return f"{ADMIN} / {password}"


def demo_never_synced() -> list[Upstream]:
    return list(Upstream.objects.filter(slug__in=DEMO_UPSTREAMS, enabled=True, last_synced_at=None))


def _key_file() -> Path:
    return settings.VAR_DIR / "demo_key"


def _kept_key(name: str, key_file: Path, team: Team | None = None) -> str:
    """The key kept in `key_file` while it still opens the agent `name`, else a new one kept there (the agent
    made in `team` if need be). It is kept so that a restart prints the key the client was given, rather than
    one more valid key."""
    agent = Agent.objects.filter(name=name).first()
    kept = key_file.read_text().strip() if key_file.exists() else ""
    if agent and _key_opens(agent, kept):
        return kept
    if agent:
        issued = agent_key_issue(agent=agent, actor="setup_demo")
    else:
        issued = agent_create(name=name, actor="setup_demo", team=team)
    key_file.touch(mode=0o600)
    key_file.write_text(issued.key)
    return issued.key


def _key_opens(agent: Agent, key: str) -> bool:
    split = key_split(key)
    stored = agent.keys.filter(prefix=split[0], revoked=False).first() if split else None
    unexpired = stored is not None and (stored.expires_at is None or stored.expires_at > timezone.now())
    return unexpired and key_matches(stored.digest, split[1])


def sync_in_thread(upstream: Upstream) -> SyncReport:
    try:
        return upstream_catalog_sync(upstream=upstream)
    finally:
        connection.close()  # this thread's own (Django's are per thread), which nothing else would close
