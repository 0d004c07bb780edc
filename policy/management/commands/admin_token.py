"""`manage.py admin_token <user> [--label L]`: issue a REST API token acting as that user (printed once)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from policy.services import admin_token_issue


class Command(BaseCommand):
    help = "Issue an admin token for the REST API; it acts with the user's permissions and is shown once."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--label", default="")

    def handle(self, *args, username: str, label: str, **options) -> None:
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"No active user {username!r}.")
        self.stdout.write(admin_token_issue(user=user, label=label, actor="manage.py admin_token"))
