from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class AuditConfig(AppConfig):
    default = True
    name = "audit"
    verbose_name = "Audit trail"

    def ready(self) -> None:
        # Connects the audit row of a sign-in lock to axes' signal; axes' models load only once apps are ready.
        from audit import sign_in  # noqa: F401


class ConsoleAdminConfig(admin_apps.AdminConfig):
    """django.contrib.admin, on the console's site (gateway_project/admin_site.py)."""

    default = False
    default_site = "gateway_project.admin_site.ConsoleSite"
