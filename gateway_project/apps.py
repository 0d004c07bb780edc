from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """The project itself, as an app: its system checks (gateway_project/checks.py)."""

    name = "gateway_project"
    verbose_name = "Switchboard"

    def ready(self) -> None:
        from gateway_project import checks  # noqa: F401  (registers them)
