from django.apps import AppConfig
from django.conf import settings

from gateway_project.lib.malloc_trim import malloc_trim_start


class GatewayConfig(AppConfig):
    """The project itself, as an app: its system checks (gateway_project/checks.py), and in every process that
    sets it up (web, worker, beat, commands) the trimming of malloc's free memory (lib/malloc_trim.py)."""

    name = "gateway_project"
    verbose_name = "Switchboard"

    def ready(self) -> None:
        from gateway_project import checks  # noqa: F401  (registers them)

        malloc_trim_start(interval=settings.GATEWAY_MALLOC_TRIM_SECONDS)
