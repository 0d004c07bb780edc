from django.apps import AppConfig
from django.contrib import admin
from django.contrib.admin import apps as admin_apps
from django.contrib.admin.checks import check_admin_app, check_dependencies
from django.contrib.staticfiles.apps import StaticFilesConfig
from django.core import checks


class AuditConfig(AppConfig):
    default = True
    name = "audit"
    verbose_name = "Audit trail"

    def ready(self) -> None:
        # Connects the audit row of a sign-in lock to axes' signal; axes' models load only once apps are ready.
        from audit import sign_in  # noqa: F401


class ConsoleAdminConfig(admin_apps.SimpleAdminConfig):
    """django.contrib.admin, on the console's site (gateway_project/admin_site.py). Its pages (each app's admin.py,
    and the console's views they import) register when first needed, not at setup: by the URLconf
    (gateway_project/urls.py), by the admin's checks below, by what reads the site's registry
    (policy/console_groups.py). Serving /mcp needs none of them, and a start's first call no longer waits for them
    (docs/benchmarks.md, "Cold start of the embedded default")."""

    default_site = "gateway_project.admin_site.ConsoleSite"

    def ready(self) -> None:
        checks.register(check_dependencies, checks.Tags.admin)
        checks.register(_pages_checked, checks.Tags.admin)


def _pages_checked(app_configs, **kwargs) -> list[checks.CheckMessage]:
    """The admin's checks of its pages, once they are registered."""
    admin.autodiscover()
    return check_admin_app(app_configs, **kwargs)


class ConsoleStaticFilesConfig(StaticFilesConfig):
    """django.contrib.staticfiles, gathering only what the console serves: collectstatic hashes and compresses
    every file it gathers, and the REST API renders JSON only, so DRF's browsable-API assets are never asked for."""

    ignore_patterns = [*StaticFilesConfig.ignore_patterns, "rest_framework/*"]
