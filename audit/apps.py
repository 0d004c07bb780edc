from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps
from django.contrib.staticfiles.apps import StaticFilesConfig


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


class ConsoleStaticFilesConfig(StaticFilesConfig):
    """django.contrib.staticfiles, gathering only what the console serves: collectstatic hashes and compresses
    every file it gathers, and the REST API renders JSON only, so DRF's browsable-API assets are never asked for."""

    ignore_patterns = [*StaticFilesConfig.ignore_patterns, "rest_framework/*"]
