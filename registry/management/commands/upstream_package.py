from django.core.management.base import BaseCommand, CommandError

from registry.models import Upstream
from registry.package_pins import package_approve, package_update
from registry.upstreams.packages import PackageProblem

ACTOR = "manage.py upstream_package"


class Command(BaseCommand):
    help = (
        'An npx or uvx upstream\'s package (docs/security.md, "Stdio servers"): --update installs it again and holds '
        "one that came back different; --approve makes the held one the pinned one, which runs from the next start."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("slug", help="The upstream")
        action = parser.add_mutually_exclusive_group(required=True)
        action.add_argument("--update", action="store_true", help="Install it again; a changed package is held")
        action.add_argument("--approve", action="store_true", help="Pin the held package")

    def handle(self, *args, slug: str, update: bool, approve: bool, **options) -> None:
        upstream = Upstream.objects.filter(slug=slug).first()
        if upstream is None:
            raise CommandError(f"no upstream is named {slug!r}")
        try:
            said = (package_update if update else package_approve)(upstream=upstream, actor=ACTOR)
        except PackageProblem as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"{slug}: {said}")
