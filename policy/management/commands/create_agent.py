from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError

from policy.services import agent_create


class Command(BaseCommand):
    help = "Create an agent and print its API key (shown once: it is stored only as a hash)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")

    def handle(self, *args, name: str, **options) -> None:
        try:
            issued = agent_create(name=name, actor="manage.py create_agent")
        except IntegrityError as exc:
            raise CommandError(f"An agent named {name!r} already exists.") from exc
        except ValidationError as exc:
            raise CommandError(f"The name {name!r} is refused: {exc.messages[0]}") from exc
        self.stdout.write(issued.key)
